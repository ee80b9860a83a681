"""What every collector provides: its devices and one ``[D, M]`` sample per round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Device:
    """One device of the node. kind: "nvidia" | "ascend" | "sim" | "host"."""

    device_id: str
    index: int
    kind: str
    model: str
    memory_total_bytes: int


class Collector(Protocol):
    """A source of device telemetry.

    ``metrics`` names the M columns (units in the name). ``sample(now)`` returns float64
    ``[D, M]`` for ``devices`` in order; NaN marks a value not measured this round. ``now`` is
    unix seconds (rates are computed from deltas between calls).
    """

    devices: list[Device]
    metrics: tuple[str, ...]

    def sample(self, now: float) -> np.ndarray: ...

    def close(self) -> None: ...


class RateTracker:
    """Rates (per second) from cumulative counters, keyed by name; first call yields NaN."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def rate(self, key: str, value: float, now: float) -> float:
        prev = self._last.get(key)
        self._last[key] = (value, now)
        if prev is None or now <= prev[1] or value < prev[0]:
            return float("nan")  # first reading, clock went back, or counter reset
        return (value - prev[0]) / (now - prev[1])
