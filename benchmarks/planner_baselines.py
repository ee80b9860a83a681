"""Baselines for the planner benchmark.

- ``eplb_greedy_loop``: EPLB's greedy written the plain way, one layer at a time with Python
  loops over slots (numpy only inside a step) - the speed reference.
- ``swap_heaviest``: the simple incremental heuristic: in each layer, repeatedly swap one
  expert of the most loaded GPU with one expert of another GPU (the swap that lowers the
  layer's maximum the most) until the layer reaches its target or no swap helps.
"""

from __future__ import annotations

import numpy as np


def eplb_greedy_loop(loads: np.ndarray, gpus: int, slots_per_gpu: int) -> np.ndarray:
    """``loads [L, E]`` -> ``phy2log [L, G*S]``, layer by layer."""
    num_layers, num_experts = loads.shape
    num_slots = gpus * slots_per_gpu
    out = np.empty((num_layers, num_slots), dtype=np.int64)
    for layer in range(num_layers):
        w = loads[layer].astype(np.float64)
        counts = np.ones(num_experts, dtype=np.int64)
        for _ in range(num_slots - num_experts):
            counts[int(np.argmax(w / counts))] += 1
        experts = np.repeat(np.arange(num_experts), counts)
        weight = w[experts] / counts[experts]
        order = np.argsort(-weight, kind="stable")
        pack_load = np.zeros(gpus)
        fill = np.zeros(gpus, dtype=np.int64)
        for k in order:
            masked = np.where(fill < slots_per_gpu, pack_load, np.inf)
            g = int(np.argmin(masked))
            out[layer, g * slots_per_gpu + fill[g]] = experts[k]
            fill[g] += 1
            pack_load[g] += weight[k]
    return out


def swap_heaviest(
    loads: np.ndarray, current: np.ndarray, gpus: int, target: np.ndarray, max_swaps: int = 1000
) -> np.ndarray:
    """``loads [L, E]``, ``current [L, G*S]``, ``target [L]`` balancedness -> ``phy2log``."""
    loads = np.asarray(loads, dtype=np.float64)
    phy = current.copy()
    num_layers, num_slots = phy.shape
    spg = num_slots // gpus
    counts = np.stack([np.bincount(row, minlength=loads.shape[1]) for row in phy])
    slot_gpu = np.arange(num_slots) // spg
    for layer in range(num_layers):
        per = loads[layer, phy[layer]] / counts[layer, phy[layer]]
        for _ in range(max_swaps):
            lg = per.reshape(gpus, spg).sum(axis=1)
            a = int(np.argmax(lg))
            if lg.mean() <= 0 or lg[a] / lg.mean() <= target[layer]:
                break
            rest = lg.copy()
            rest[a] = -np.inf
            sa = np.arange(a * spg, (a + 1) * spg)
            delta = per[sa][:, None] - per[None, :]  # [S, N]
            others = np.sort(rest)[::-1]
            second = np.where(
                slot_gpu[None, :] == int(np.argmax(rest)), others[1] if gpus > 2 else -np.inf,
                others[0],
            )
            new_max = np.maximum(np.maximum(lg[a] - delta, lg[slot_gpu][None, :] + delta), second)
            new_max[:, slot_gpu == a] = np.inf
            i, j = np.unravel_index(int(np.argmin(new_max)), new_max.shape)
            if new_max[i, j] >= lg[a] * (1 - 1e-12):
                break
            s1 = sa[i]
            phy[layer, s1], phy[layer, j] = phy[layer, j], phy[layer, s1]
            per[s1], per[j] = per[j], per[s1]
    return phy
