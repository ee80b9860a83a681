"""Placement checks and slot tables the SDK's dispatch and migration need: pure numpy, no
torch, no I/O. Per-rank loads and balancedness are :mod:`moeplane.controlplane.balancing`'s.

Conventions (EPLB-compatible, see the architecture notes):

- ``loads[L, E]``: tokens routed to each logical expert per MoE layer (int or float, >= 0).
- ``phy2log[L, G*S]`` int64: the logical expert held by each physical slot; rank ``g`` owns
  slots ``g*S .. (g+1)*S-1``. A logical expert may hold several slots (replicas); its tokens
  are split evenly across them.
- balancedness = mean over layers of (max rank load / mean rank load); 1.0 is perfect.
"""

from __future__ import annotations

import numpy as np


class PlacementError(ValueError):
    """A placement that is malformed. ``field`` names the offending argument."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_phy2log(
    phy2log: np.ndarray, *, layers: int, experts: int, world_size: int, slots_per_rank: int
) -> np.ndarray:
    """Validate ``phy2log[L, G*S]`` and return it as int64.

    Raises :class:`PlacementError` naming ``phy2log`` when the shape is not
    ``[layers, world_size*slots_per_rank]``, an id is outside ``[0, experts)``, or a layer leaves
    a logical expert without any slot (its tokens would have nowhere to go).
    """
    arr = np.asarray(phy2log)
    want = (layers, world_size * slots_per_rank)
    if arr.ndim != 2 or arr.shape != want:
        raise PlacementError("phy2log", f"shape {arr.shape} does not match the model's {want}")
    if arr.dtype.kind not in "iu":
        raise PlacementError("phy2log", f"dtype {arr.dtype} is not an integer type")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < 0) | (arr >= experts)
    if bad.any():
        layer, slot = (int(v) for v in np.argwhere(bad)[0])
        raise PlacementError(
            "phy2log",
            f"unknown expert id {int(arr[layer, slot])} at layer {layer} slot {slot} "
            f"(experts are 0..{experts - 1})",
        )
    for layer in range(layers):
        missing = np.setdiff1d(np.arange(experts), arr[layer])
        if missing.size:
            raise PlacementError(
                "phy2log", f"layer {layer} holds no slot for expert(s) {missing[:8].tolist()}"
            )
    return arr


def replica_table(phy2log_row: np.ndarray, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Replicas of each logical expert in one layer.

    Args:
        phy2log_row: ``[G*S]`` logical expert of each physical slot.
        experts: number of logical experts E.

    Returns:
        ``slots[E, R]`` int64, the global slot ids of each expert's replicas in ascending order,
        padded with -1 (R = the largest replica count, at least 1); ``count[E]`` int64, replicas
        per expert.
    """
    row = np.asarray(phy2log_row, dtype=np.int64)
    count = np.bincount(row, minlength=experts).astype(np.int64)
    width = max(int(count.max(initial=0)), 1)
    slots = np.full((experts, width), -1, dtype=np.int64)
    order = np.argsort(row, kind="stable")  # slots grouped by expert, ascending within
    starts = np.cumsum(count) - count
    rank_in_group = np.arange(row.size) - starts[row[order]]
    slots[row[order], rank_in_group] = order
    return slots, count


def migration_sources(old_row: np.ndarray, new_row: np.ndarray, slots_per_rank: int) -> np.ndarray:
    """For each new slot, the old slot whose contents it takes (one layer).

    A slot copies locally when its rank already holds the expert (the lowest such old slot);
    otherwise it fetches from the old replicas of the expert in turn, spreading the sends.

    Args:
        old_row: ``[G*S]`` running placement.
        new_row: ``[G*S]`` target placement.
        slots_per_rank: S.

    Returns:
        ``src[G*S]`` int64: global old slot id for each new slot.
    """
    old_row = np.asarray(old_row, dtype=np.int64)
    new_row = np.asarray(new_row, dtype=np.int64)
    if old_row.shape != new_row.shape:
        raise PlacementError("new_row", f"shape {new_row.shape} != {old_row.shape}")
    src = np.empty(new_row.size, dtype=np.int64)
    turn: dict[int, int] = {}
    for slot, expert in enumerate(new_row.tolist()):
        rank = slot // slots_per_rank
        mine = old_row[rank * slots_per_rank : (rank + 1) * slots_per_rank]
        local = np.flatnonzero(mine == expert)
        if local.size:
            src[slot] = rank * slots_per_rank + int(local[0])
            continue
        holders = np.flatnonzero(old_row == expert)
        if not holders.size:
            raise PlacementError("old_row", f"expert {expert} is held by no slot")
        k = turn.get(expert, 0)
        src[slot] = int(holders[k % holders.size])
        turn[expert] = k + 1
    return src
