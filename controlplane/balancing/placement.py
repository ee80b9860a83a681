"""Array helpers for placements: replica counts, per-GPU loads, balancedness, moves.

Conventions (ARCHITECTURE.md, EPLB-compatible):

- ``loads [L, E]``: tokens routed to each logical expert of each MoE layer;
- ``phy2log [L, G*S]``: logical expert held by each physical slot; GPU ``g`` owns slots
  ``g*S .. (g+1)*S-1``;
- a logical expert's tokens split evenly across its replicas;
- balancedness of a layer = max GPU load / mean GPU load (1.0 is perfect; a layer with no
  load counts as 1.0); the balancedness of a placement is the mean over layers.

A *move* is a (layer, GPU, logical expert) that a new placement has and a reference placement
does not: one expert's weights copied onto that GPU.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "balancedness",
    "count_moves",
    "gpu_expert_counts",
    "gpu_loads",
    "identity_placement",
    "layer_balancedness",
    "match_gpus",
    "replica_counts",
    "take_rows",
]


def take_rows(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``arr [R, N]``, ``idx [R, K]`` int -> ``[R, K]``: ``arr[r, idx[r, k]]``.

    ``np.take_along_axis(arr, idx, axis=1)`` without its argument checks, which dominate
    on the small arrays of the planner's inner loop."""
    return arr[np.arange(arr.shape[0])[:, None], idx]


def identity_placement(num_layers: int, num_experts: int, num_slots: int) -> np.ndarray:
    """The placement with slot ``s`` holding expert ``s % E``: int64 ``[L, num_slots]``."""
    row = np.arange(num_slots, dtype=np.int64) % num_experts
    return np.tile(row, (num_layers, 1))


def replica_counts(phy2log: np.ndarray, num_experts: int) -> np.ndarray:
    """Replicas of each logical expert: ``phy2log [L, N]`` -> int64 ``[L, E]``."""
    num_layers = phy2log.shape[0]
    flat = phy2log + (np.arange(num_layers, dtype=np.int64) * num_experts)[:, None]
    counts = np.bincount(flat.ravel(), minlength=num_layers * num_experts)
    return counts.reshape(num_layers, num_experts).astype(np.int64, copy=False)


def gpu_expert_counts(phy2log: np.ndarray, gpus: int, num_experts: int) -> np.ndarray:
    """Replicas of each expert on each GPU: ``phy2log [L, G*S]`` -> int64 ``[L, G, E]``."""
    num_layers, num_slots = phy2log.shape
    slots_per_gpu = num_slots // gpus
    gpu_of_slot = np.arange(num_slots, dtype=np.int64) // slots_per_gpu
    layer = np.arange(num_layers, dtype=np.int64)[:, None]
    flat = (layer * gpus + gpu_of_slot[None, :]) * num_experts + phy2log
    counts = np.bincount(flat.ravel(), minlength=num_layers * gpus * num_experts)
    return counts.reshape(num_layers, gpus, num_experts)


def gpu_loads(loads: np.ndarray, phy2log: np.ndarray, gpus: int) -> np.ndarray:
    """Predicted tokens per GPU: ``loads [L, E]``, ``phy2log [L, G*S]`` -> float64 ``[L, G]``.

    Each logical expert's load is split evenly across its replicas.
    """
    loads = np.asarray(loads, dtype=np.float64)
    counts = replica_counts(phy2log, loads.shape[1])
    rows = np.arange(phy2log.shape[0])[:, None]
    per_slot = loads[rows, phy2log] / counts[rows, phy2log]
    return per_slot.reshape(phy2log.shape[0], gpus, -1).sum(axis=2)


def layer_balancedness(per_gpu: np.ndarray) -> np.ndarray:
    """Max over mean of per-GPU loads: ``per_gpu [L, G]`` -> float64 ``[L]`` (1.0 if no load)."""
    mean = per_gpu.mean(axis=1)
    peak = per_gpu.max(axis=1)
    safe = np.where(mean > 0, mean, 1.0)
    return np.where(mean > 0, peak / safe, 1.0)


def balancedness(loads: np.ndarray, phy2log: np.ndarray, gpus: int) -> float:
    """Mean over layers of (max GPU load / mean GPU load) for ``loads [L, E]`` placed by
    ``phy2log [L, G*S]`` on ``gpus`` GPUs. 1.0 is perfect."""
    return float(layer_balancedness(gpu_loads(loads, phy2log, gpus)).mean())


def count_moves(
    reference: np.ndarray, phy2log: np.ndarray, gpus: int, num_experts: int
) -> np.ndarray:
    """Moves per layer from ``reference [L, G*S]`` to ``phy2log [L, G*S]``: int64 ``[L]``.

    A move is a (GPU, logical expert) pair present in ``phy2log`` and absent in ``reference``.
    """
    before = gpu_expert_counts(reference, gpus, num_experts) > 0
    after = gpu_expert_counts(phy2log, gpus, num_experts) > 0
    return (after & ~before).sum(axis=(1, 2)).astype(np.int64)


def match_gpus(
    reference: np.ndarray, phy2log: np.ndarray, gpus: int, num_experts: int
) -> np.ndarray:
    """``phy2log [L, G*S]`` with its GPUs renumbered to keep as many of ``reference
    [L, G*S]``'s (GPU, expert) pairs as a greedy matching finds: int64 ``[L, G*S]``.

    Renumbering whole GPUs leaves every GPU's load, hence the balance, unchanged; only the
    moves against ``reference`` drop. Greedy: repeatedly pair the new GPU and the reference
    GPU with the most experts in common (ties: lowest indices), per layer.
    """
    num_layers, num_slots = phy2log.shape
    spg = num_slots // gpus
    had = gpu_expert_counts(reference, gpus, num_experts) > 0  # [L, G, E]
    has = gpu_expert_counts(phy2log, gpus, num_experts) > 0
    common = np.einsum("lge,lhe->lgh", has.astype(np.int64), had.astype(np.int64))
    out = np.empty_like(phy2log)
    for lay in range(num_layers):
        ov = common[lay].astype(np.float64)
        target = np.empty(gpus, dtype=np.int64)
        for _ in range(gpus):
            g, h = divmod(int(np.argmax(ov)), gpus)
            target[g] = h
            ov[g, :] = -1.0
            ov[:, h] = -1.0
        blocks = np.empty((gpus, spg), dtype=phy2log.dtype)
        blocks[target] = phy2log[lay].reshape(gpus, spg)
        out[lay] = blocks.ravel()
    return out
