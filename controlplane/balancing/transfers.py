"""Weight transfers that carry out a placement change, with their sources.

For each move (layer, GPU, logical expert) of ``new`` against ``reference``, one transfer:
the destination slot is the first slot of that GPU holding the expert in ``new``; the source
is a GPU holding the expert in ``reference``, on the destination's node when one does (a
*same-node* move) and otherwise anywhere (a *cross-node* move). Moves that draw on the same
holders take them in turn, so sends spread over the holders.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.balancing.placement import gpu_expert_counts

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
    keep = np.zeros(flat_key.size, dtype=bool)
    keep[first] = True  # row-major order: by layer, then slot
    lay = layer_ix[is_new][keep]
    slot = np.broadcast_to(np.arange(num_slots)[None, :], new.shape)[is_new][keep]
    exp = new[is_new][keep]
    dst_gpu = slot // spg
    if lay.size == 0:
        return np.zeros((0, 4), dtype=np.int64), np.zeros(0, dtype=bool)

    holders = had[lay, :, exp]  # [M, G]
    node_of_gpu = np.arange(gpus) // per_node
    same = holders & (node_of_gpu[None, :] == (dst_gpu // per_node)[:, None])
    cross = ~same.any(axis=1)
    pool = np.where(cross[:, None], holders, same)
    # turn-taking: the k-th move drawing on the same (layer, expert, pool) takes holder k mod n
    pool_key = (lay * num_experts + exp) * (nodes + 1) + np.where(cross, 0, dst_gpu // per_node + 1)
    order = np.argsort(pool_key, kind="stable")
    sorted_key = pool_key[order]
    turn = np.empty(len(pool_key), dtype=np.int64)
    turn[order] = np.arange(len(pool_key)) - np.searchsorted(sorted_key, sorted_key, "left")
    n_pool = pool.sum(axis=1)
    pick = turn % n_pool
    _, holder = np.nonzero(pool)  # row-major: each move's pool holders, lowest GPU first
    src = holder[np.cumsum(n_pool) - n_pool + pick]
    transfers = np.stack([lay, slot, exp, src], axis=1).astype(np.int64)
    return transfers, cross
