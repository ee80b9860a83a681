"""A plan's placement against the running one: which slots change, which experts gain or lose
replicas (pure: arrays in, arrays and dicts out).

Shapes: ``running`` and ``proposed`` int [L, G*S] (``phy2log``: logical expert of each physical
slot; rank ``g`` owns slots ``g*S .. (g+1)*S-1``). No I/O, no clocks, no globals; validation
raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.dashboard.placement import replica_counts


@dataclass(frozen=True)
class PlacementDiff:
    """``changed`` bool [L, G*S]: the slot holds another expert under the plan;
    ``replica_delta`` int64 [L, E]: replicas under the plan minus replicas running (> 0 gains,
    < 0 loses); ``changed_per_rank`` int64 [L, G]: changed slots of each rank."""

    changed: np.ndarray
    replica_delta: np.ndarray
    changed_per_rank: np.ndarray

    @property
    def slots_changed(self) -> int:
        return int(self.changed.sum())

    @property
    def layers_changed(self) -> int:
        return int(self.changed.any(axis=1).sum())

    @property
    def experts_gaining(self) -> int:
        """(layer, expert) pairs that gain at least one replica."""
        return int((self.replica_delta > 0).sum())

    @property
    def experts_losing(self) -> int:
        """(layer, expert) pairs that lose at least one replica."""
        return int((self.replica_delta < 0).sum())


def placement_diff(running: np.ndarray, proposed: np.ndarray, experts: int, ranks: int) -> PlacementDiff:
    """Compare ``proposed`` with ``running`` (both [L, G*S]) for ``experts`` E and ``ranks`` G."""
    running = np.asarray(running, dtype=np.int64)
    proposed = np.asarray(proposed, dtype=np.int64)
    if running.ndim != 2:
        raise ValueError(f"running: expected [L, G*S], got shape {running.shape}")
    if proposed.shape != running.shape:
        raise ValueError(f"proposed: shape {proposed.shape} differs from the running {running.shape}")
    if experts < 1:
        raise ValueError(f"experts: must be >= 1, got {experts}")
    if ranks < 1 or running.shape[1] % ranks:
        raise ValueError(f"ranks: {ranks} does not divide the {running.shape[1]} slots")
    for name, arr in (("running", running), ("proposed", proposed)):
        if arr.size and (arr.min() < 0 or arr.max() >= experts):
            raise ValueError(f"{name}: logical expert ids must be in 0..{experts - 1}")
    changed = running != proposed
    delta = replica_counts(proposed, experts) - replica_counts(running, experts)
    per_rank = changed.reshape(running.shape[0], ranks, -1).sum(axis=2).astype(np.int64)
    return PlacementDiff(changed, delta, per_rank)


def changed_slots(
    running: np.ndarray,
    proposed: np.ndarray,
    ranks: int,
    ranks_per_node: int | None = None,
    limit: int = 200,
) -> list[dict]:
    """The first ``limit`` changed slots, layer by layer: dicts with layer, rank, slot (on its
    rank), before, after (logical expert ids) and ``cross_node`` — True when ``after`` is held
    by no rank of the same node in the running placement of that layer (its weights must
    cross nodes). ``cross_node`` is None when ``ranks_per_node`` is unknown."""
    running = np.asarray(running, dtype=np.int64)
    proposed = np.asarray(proposed, dtype=np.int64)
    if proposed.shape != running.shape or running.ndim != 2:
        raise ValueError(f"proposed: shape {proposed.shape} differs from the running {running.shape}")
    if ranks < 1 or running.shape[1] % ranks:
        raise ValueError(f"ranks: {ranks} does not divide the {running.shape[1]} slots")
    if ranks_per_node is not None and (ranks_per_node < 1 or ranks % ranks_per_node):
        raise ValueError(f"ranks_per_node: {ranks_per_node} does not divide {ranks} ranks")
    if limit < 0:
        raise ValueError(f"limit: must be >= 0, got {limit}")
    slots = running.shape[1] // ranks
    out: list[dict] = []
    layers, cols = np.nonzero(running != proposed)
    for layer, col in zip(layers[:limit].tolist(), cols[:limit].tolist(), strict=True):
        rank, slot = divmod(col, slots)
        after = int(proposed[layer, col])
        cross = None
        if ranks_per_node is not None:
            node = rank // ranks_per_node
            span = slice(node * ranks_per_node * slots, (node + 1) * ranks_per_node * slots)
            cross = bool(after not in running[layer, span])
        out.append({"layer": layer, "rank": rank, "slot": slot, "before": int(running[layer, col]),
                    "after": after, "cross_node": cross})
    return out
