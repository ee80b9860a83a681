"""Reference: DeepSeek EPLB's global greedy policy, in numpy, vectorized across layers.

Written from the published description: replicate the expert with the highest load per
replica into each redundant slot, then pack the replicas onto GPUs heaviest first, each into
the lightest GPU that still has a free slot (ties: the lowest GPU index, as EPLB's ``min``).
The planner starts from this placement; the benchmark and the tests compare against it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["eplb_greedy", "eplb_replica_counts", "pack_replicas"]


def eplb_replica_counts(loads: np.ndarray, num_slots: int) -> np.ndarray:
    """Replica counts from EPLB's replication rule.

    ``loads [L, E]`` float, ``num_slots`` = G*S >= E -> int64 ``[L, E]`` summing to
    ``num_slots`` per layer. Each redundant slot goes to the expert with the highest
    load per replica (ties: the lowest expert index).
    """
    loads = np.asarray(loads, dtype=np.float64)
    num_layers, num_experts = loads.shape
    counts = np.ones((num_layers, num_experts), dtype=np.int64)
    rows = np.arange(num_layers)
    for _ in range(num_slots - num_experts):
        pick = np.argmax(loads / counts, axis=1)
        counts[rows, pick] += 1
    return counts


def pack_replicas(
    loads: np.ndarray, counts: np.ndarray, gpus: int, slots_per_gpu: int
) -> np.ndarray:
    """Pack replicas heaviest first, each into the lightest GPU with a free slot.

    ``loads [L, E]`` float, ``counts [L, E]`` int summing to G*S per layer ->
    ``phy2log [L, G*S]`` int64. Replica weight is ``loads / counts``; ties in weight keep
    expert order (stable sort).
    """
    loads = np.asarray(loads, dtype=np.float64)
    num_layers, num_experts = loads.shape
    num_slots = gpus * slots_per_gpu
    experts = np.repeat(np.tile(np.arange(num_experts), num_layers), counts.ravel())
    experts = experts.reshape(num_layers, num_slots)
    weight = np.take_along_axis(loads / counts, experts, axis=1)
    order = np.argsort(-weight, axis=1, kind="stable")
    experts = np.take_along_axis(experts, order, axis=1)
    weight = np.take_along_axis(weight, order, axis=1)

    # flat views, one update each per slot: ``avail`` is a GPU's load, or inf once full;
    # ``nxt`` the flat index of its next free slot; ``last`` is inf at a GPU's last slot,
    # else 0 (adding it to a load is exact)
    experts = np.ascontiguousarray(experts.T)  # [N, L]: the k-th heaviest replica per layer
    weight = np.ascontiguousarray(weight.T)
    avail = np.zeros(num_layers * gpus)
    phy2log = np.empty(num_layers * num_slots, dtype=np.int64)
    nxt = np.arange(num_layers * gpus) * slots_per_gpu
    last = np.zeros((num_layers * gpus, slots_per_gpu))
    last[:, -1] = np.inf
    last = last.ravel()
    gpu_base = np.arange(num_layers) * gpus
    avail_2d = avail.reshape(num_layers, gpus)
    start = 0
    if num_slots >= gpus and weight[gpus - 1].min() > 0:
        # the G heaviest replicas of a layer all weigh > 0: the k-th goes to the empty GPU k
        # (the lightest, lowest index), exactly as the loop below would place them
        slot = nxt.reshape(num_layers, gpus)
        phy2log[slot] = experts[:gpus].T
        avail_2d += weight[:gpus].T
        avail += last[nxt]
        nxt += 1
        start = gpus
    for k in range(start, num_slots):
        at = avail_2d.argmin(axis=1)  # lightest GPU with a free slot (lowest index)
        at += gpu_base
        slot = nxt[at]
        phy2log[slot] = experts[k]
        nxt[at] += 1
        load = avail[at] + weight[k]
        load += last[slot]
        avail[at] = load
    phy2log = phy2log.reshape(num_layers, num_slots)
    return phy2log


def eplb_greedy(loads: np.ndarray, gpus: int, slots_per_gpu: int) -> np.ndarray:
    """EPLB's global policy: ``loads [L, E]`` -> ``phy2log [L, G*S]`` int64.

    The caller guarantees G*S >= E and non-negative finite loads (``plan_placement`` validates).
    """
    counts = eplb_replica_counts(loads, gpus * slots_per_gpu)
    return pack_replicas(loads, counts, gpus, slots_per_gpu)
