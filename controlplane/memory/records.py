"""Validated memory profiles as the store keeps them (decoded by :mod:`.codec`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeMemoryRecord:
    """Free host memory of a node at one step (bytes)."""

    job_id: str
    node_id: str
    step: int
    ts: float
    host_free_bytes: int


@dataclass(frozen=True)
class ProfileRecord:
    """One device's validated memory profile at one step. Bytes are bytes, times seconds.

    ``layers``: dicts with name, activation_bytes, forward_s, backward_s, parameter_bytes,
    optimizer_bytes, in forward order. ``applied_actions``: "kind:layer" in effect.
    """

    job_id: str
    device_id: str
    node_id: str
    rank: int
    step: int
    ts: float
    capacity_bytes: int
    used_bytes: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: int
    host_link_bytes_per_s: float
    applied_actions: tuple[str, ...]
    layers: tuple[dict, ...]
