"""Weight transfers that carry out a placement change, with their sources.

For each move (layer, GPU, logical expert) of ``new`` against ``reference``, one transfer:
the destination slot is the first slot of that GPU holding the expert in ``new``; the source
is a GPU holding the expert in ``reference``, on the destination's node when one does (a
*same-node* move) and otherwise anywhere (a *cross-node* move). Moves that draw on the same
holders take them in turn, so sends spread over the holders.
"""

from __future__ import annotations

import numpy as np

from controlplane.balancing.placement import gpu_expert_counts

__all__ = ["plan_transfers"]


def plan_transfers(
    reference: np.ndarray, new: np.ndarray, gpus: int, num_experts: int, nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Transfers from ``reference [L, G*S]`` to ``new [L, G*S]``.

    Returns ``transfers [M, 4]`` int64 rows (layer, destination slot, logical expert,
    source GPU), ordered by layer, destination slot; and ``cross [M]`` bool, True where the
    source is on another node. GPU ``g`` is on node ``g // (G / nodes)``.
    """
    num_layers, num_slots = new.shape
    spg = num_slots // gpus
    per_node = gpus // nodes
    had = gpu_expert_counts(reference, gpus, num_experts) > 0  # [L, G, E]
    slot_gpu = np.arange(num_slots) // spg
    layer_ix = np.broadcast_to(np.arange(num_layers)[:, None], new.shape)
    is_new = ~had[layer_ix, slot_gpu[None, :], new]  # [L, N]
    # keep the first slot of each (layer, gpu, expert) that is new
    key = (layer_ix * gpus + slot_gpu[None, :]) * num_experts + new
    flat_key = key[is_new]
    _, first = np.unique(flat_key, return_index=True)
    lay = layer_ix[is_new][first]
    slot = np.broadcast_to(np.arange(num_slots)[None, :], new.shape)[is_new][first]
    exp = new[is_new][first]
    order = np.lexsort((slot, lay))
    lay, slot, exp = lay[order], slot[order], exp[order]
    dst_gpu = slot // spg
    if lay.size == 0:
        return np.zeros((0, 4), dtype=np.int64), np.zeros(0, dtype=bool)

    holders = had[lay, :, exp]  # [M, G]
    same = holders & ((np.arange(gpus)[None, :] // per_node) == (dst_gpu // per_node)[:, None])
    cross = ~same.any(axis=1)
    pool = np.where(cross[:, None], holders, same)
    # turn-taking: the k-th move drawing on the same (layer, expert, pool) takes holder k mod n
    pool_key = np.concatenate(
        [lay[:, None], exp[:, None], np.where(cross, -1, dst_gpu // per_node)[:, None]], axis=1
    )
    _, inverse = np.unique(pool_key, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    sorted_inv = inverse[order]
    turn = np.empty(len(inverse), dtype=np.int64)
    turn[order] = np.arange(len(inverse)) - np.searchsorted(sorted_inv, sorted_inv, "left")
    n_pool = pool.sum(axis=1)
    pick = turn % n_pool
    rank = np.cumsum(pool, axis=1) - 1  # rank of each holder within its pool
    src = np.argmax(pool & (rank == pick[:, None]), axis=1)
    transfers = np.stack([lay, slot, exp, src], axis=1).astype(np.int64)
    return transfers, cross
