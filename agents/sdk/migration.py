"""Move expert slots between ranks: weights and their optimizer state, staged then committed.

Every rank computes the same transfer list from (running placement, target placement) with
:func:`moeplane.agents.sdk.placement.migration_sources`. Slots that stay on a rank are copied locally;
the others travel in one batched point-to-point round (``batch_isend_irecv``), received straight
into the staged tensors. Nothing running changes until :func:`commit`: :func:`stage` builds the new
tensors beside the old ones.

Per slot, the moved tensors are the expert parameters and every optimizer-state tensor of the
parameter's shape (Adam/AdamW ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``; SGD
``momentum_buffer``). Adam's ``step`` is one scalar per stacked parameter, equal on every rank
because every rank steps every parameter each step (:func:`moeplane.agents.sdk.moe.sync_gradients`
materialises missing gradients); it stays where it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from moeplane.agents.sdk.comm import global_rank
from moeplane.agents.sdk.moe import ExpertSlots
from moeplane.agents.sdk.placement import migration_sources


@dataclass
class Staged:
    """New per-slot tensors for each block, not yet in use."""

    phy2log: np.ndarray  # [L, G*S] target placement
    tensors: list[list[torch.Tensor]] = field(default_factory=list)  # per block, per slot tensor
    bytes_sent: int = 0
    bytes_received: int = 0
    slots_received: int = 0
    slots_copied: int = 0


def slot_tensors(block: ExpertSlots, optimizer) -> list[torch.Tensor]:
    """The block's tensors with leading dimension S: parameters, then their optimizer state."""
    out: list[torch.Tensor] = []
    for p in block.expert_parameters():
        out.append(p.data)
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key in sorted(state):
            value = state[key]
            if torch.is_tensor(value) and value.shape == p.shape:
                out.append(value)
    return out


@torch.no_grad()
def stage(
    blocks: list[ExpertSlots], optimizer, phy2log: np.ndarray, group=None
) -> Staged:
    """Build every block's slot tensors for ``phy2log[L, G*S]`` (a collective over ``group``).

    The caller has validated ``phy2log``. Running tensors are only read. Remote slots are
    received straight into the staged tensors (one message per slot tensor, all posted in one
    ``batch_isend_irecv``; messages between a pair of ranks match in posting order, which both
    sides derive from the same (block, slot) order).
    """
    rank = dist.get_rank(group)
    staged = Staged(phy2log=np.array(phy2log, dtype=np.int64))
    ops: list[dist.P2POp] = []
    for i, block in enumerate(blocks):
        s = block.slots_per_rank
        tensors = slot_tensors(block, optimizer)
        new = [torch.empty_like(t) for t in tensors]
        staged.tensors.append(new)
        src = migration_sources(block.phy2log_row, staged.phy2log[i], s)
        base = rank * s
        for slot, old_slot in enumerate(src.tolist()):
            dst_rank, src_rank = slot // s, old_slot // s
            if dst_rank == rank and src_rank == rank:
                for t, n in zip(tensors, new, strict=True):
                    n[slot - base].copy_(t[old_slot - base])
                staged.slots_copied += 1
            elif src_rank == rank:
                peer = global_rank(group, dst_rank)
                for t in tensors:
                    ops.append(dist.P2POp(dist.isend, t[old_slot - base], peer, group))
                    staged.bytes_sent += t[0].numel() * t.element_size()
            elif dst_rank == rank:
                peer = global_rank(group, src_rank)
                for n in new:
                    ops.append(dist.P2POp(dist.irecv, n[slot - base], peer, group))
                    staged.bytes_received += n[0].numel() * n.element_size()
                staged.slots_received += 1
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return staged


@torch.no_grad()
def commit(blocks: list[ExpertSlots], optimizer, staged: Staged) -> None:
    """Swap the staged tensors in (in place, so optimizer references stay valid) and the map."""
    for i, block in enumerate(blocks):
        for running, new in zip(slot_tensors(block, optimizer), staged.tensors[i], strict=True):
            running.copy_(new)
        block.set_placement(staged.phy2log[i])
