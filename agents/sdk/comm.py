"""Communication helpers on torch.distributed that work on gloo (CPU), NCCL and HCCL.

- :func:`all_to_all`: ``all_to_all_single`` with variable split sizes, differentiable (the
  backward pass is the reverse all-to-all with the splits swapped).
- :func:`exchange`: one batched point-to-point round (``batch_isend_irecv``), one flat buffer per
  peer and direction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # type: ignore[override]
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.contiguous()
        out = grad.new_empty((sum(ctx.in_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad, ctx.in_splits, ctx.out_splits, group=ctx.group)
        return out, None, None, None


def all_to_all(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group=None
) -> torch.Tensor:
    """Send rows of ``x[N, ...]`` to every rank; gradients flow back the same way.

    Args:
        x: ``[sum(in_splits), ...]`` rows ordered by destination rank.
        out_splits: ``[G]`` rows received from each rank.
        in_splits: ``[G]`` rows sent to each rank.
        group: process group (default: the world).

    Returns:
        ``[sum(out_splits), ...]`` rows ordered by source rank.
    """
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


def global_rank(group, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (point-to-point ops take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def exchange(
    sends: dict[int, torch.Tensor],
    recv_numels: dict[int, int],
    *,
    dtype: torch.dtype,
    device: torch.device,
    group=None,
) -> dict[int, torch.Tensor]:
    """One batched point-to-point round.

    Args:
        sends: peer rank (in ``group``) -> 1-D tensor to send to it.
        recv_numels: peer rank -> number of elements to receive from it.
        dtype, device: of the receive buffers.
        group: process group.

    Returns:
        peer rank -> received 1-D tensor of ``recv_numels[peer]`` elements.
    """
    ops = []
    received: dict[int, torch.Tensor] = {}
    for peer in sorted(set(sends) | set(recv_numels)):
        peer_global = global_rank(group, peer)
        if recv_numels.get(peer, 0) > 0:
            buf = torch.empty(recv_numels[peer], dtype=dtype, device=device)
            received[peer] = buf
            ops.append(dist.P2POp(dist.irecv, buf, peer_global, group))
        if peer in sends and sends[peer].numel() > 0:
            ops.append(dist.P2POp(dist.isend, sends[peer].contiguous(), peer_global, group))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return received
