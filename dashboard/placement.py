"""Placement arithmetic for the Experts views: pure functions, arrays in, arrays out.

Conventions (EPLB-compatible, see the architecture notes):

- ``loads``   int/float [L, E]: tokens routed to each logical expert of each MoE layer;
- ``phy2log`` int [L, G*S]: logical expert held by each physical slot; rank ``g`` owns slots
  ``g*S .. (g+1)*S-1``; a logical expert's tokens split evenly over its replicas;
- balancedness of a layer = max rank load / mean rank load (1.0 is perfect); the balancedness
  of a job is the mean of that over layers.

The arithmetic is ``moeplane.controlplane.balancing.placement``'s; this module adds the checks the
dashboard needs on placements read from the store. No I/O, no clocks, no globals.
Validation raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math

import numpy as np

from moeplane.controlplane.balancing import placement as bp


def identity_phy2log(layers: int, experts: int, ranks: int, slots_per_rank: int | None = None) -> np.ndarray:
    """The placement assumed when none is known: slot ``s`` holds logical expert ``s % E``.

    ``slots_per_rank`` S defaults to ``ceil(E / G)``; when ``G*S > E`` the extra slots hold
    replicas of the first experts. Returns int64 [L, G*S] (the same row for every layer).
    """
    if layers < 1:
        raise ValueError(f"layers: must be >= 1, got {layers}")
    if experts < 1:
        raise ValueError(f"experts: must be >= 1, got {experts}")
    if ranks < 1:
        raise ValueError(f"ranks: must be >= 1, got {ranks}")
    if slots_per_rank is None:
        slots_per_rank = math.ceil(experts / ranks)
    if slots_per_rank < 1 or slots_per_rank * ranks < experts:
        raise ValueError(
            f"slots_per_rank: {slots_per_rank} slots on {ranks} ranks cannot hold {experts} experts"
        )
    return bp.identity_placement(layers, experts, ranks * slots_per_rank)


def _check_placement(loads: np.ndarray, phy2log: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    loads = np.asarray(loads)
    phy2log = np.asarray(phy2log)
    if loads.ndim != 2:
        raise ValueError(f"loads: expected [L, E], got shape {loads.shape}")
    if phy2log.ndim != 2 or phy2log.shape[0] != loads.shape[0]:
        raise ValueError(f"phy2log: expected [{loads.shape[0]}, G*S], got shape {phy2log.shape}")
    if ranks < 1 or phy2log.shape[1] % ranks:
        raise ValueError(f"ranks: {ranks} does not divide the {phy2log.shape[1]} slots of phy2log")
    if phy2log.size and (phy2log.min() < 0 or phy2log.max() >= loads.shape[1]):
        raise ValueError(f"phy2log: logical expert ids must be in 0..{loads.shape[1] - 1}")
    return loads, phy2log.astype(np.int64, copy=False)


def replica_counts(phy2log: np.ndarray, experts: int) -> np.ndarray:
    """Replicas of each logical expert per layer: int64 [L, E] from ``phy2log`` [L, G*S]."""
    phy2log = np.asarray(phy2log, dtype=np.int64)
    if phy2log.ndim != 2:
        raise ValueError(f"phy2log: expected [L, G*S], got shape {phy2log.shape}")
    return bp.replica_counts(phy2log, experts)


def slot_loads(loads: np.ndarray, phy2log: np.ndarray) -> np.ndarray:
    """Tokens handled by each physical slot: float64 [L, G*S].

    Each logical expert's load is split evenly over its replicas; an expert with no replica
    contributes nothing (its tokens would be dropped by such a placement).
    """
    loads, phy2log = _check_placement(loads, phy2log, 1)
    reps = replica_counts(phy2log, loads.shape[1])
    per_replica = np.divide(loads, reps, out=np.zeros(loads.shape, dtype=np.float64), where=reps > 0)
    return np.take_along_axis(per_replica, phy2log, axis=1)


def rank_loads(loads: np.ndarray, phy2log: np.ndarray, ranks: int) -> np.ndarray:
    """Tokens handled by each EP rank under a placement: float64 [L, G].

    ``loads`` [L, E]; ``phy2log`` [L, G*S] with ``G = ranks``.
    """
    loads, phy2log = _check_placement(loads, phy2log, ranks)
    return bp.gpu_loads(loads, phy2log, ranks)


def layer_balancedness(per_rank: np.ndarray) -> np.ndarray:
    """Max over mean rank load of each layer: float64 [L] from ``per_rank`` [L, G].

    A layer with no tokens at all counts as perfectly balanced (1.0).
    """
    per_rank = np.asarray(per_rank, dtype=np.float64)
    if per_rank.ndim != 2 or per_rank.shape[1] < 1:
        raise ValueError(f"per_rank: expected [L, G] with G >= 1, got shape {per_rank.shape}")
    return bp.layer_balancedness(per_rank)
