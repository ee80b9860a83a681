"""Phase spans binned onto a device x time grid, for timelines too large to draw span by span.

Each span adds, to each time bin it overlaps, the seconds it spends inside that bin (spans
clipped to the bins; parts outside the grid are dropped). Overlapping spans of one device both
count, so a cell may hold more seconds than the bin is wide. Pure numpy: no loop over spans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.rl.phases import PHASES


@dataclass(frozen=True)
class Grid:
    """``bins`` time bins of ``width`` seconds from ``t0`` (unix s): bin b is
    [t0 + b*width, t0 + (b+1)*width)."""

    t0: float
    width: float
    bins: int

    @property
    def t1(self) -> float:
        return self.t0 + self.width * self.bins

    def edges(self) -> np.ndarray:
        """float64 [bins + 1]: the bin edges, unix s."""
        return self.t0 + self.width * np.arange(self.bins + 1, dtype=np.float64)


def grid_over(start: np.ndarray, end: np.ndarray, bins: int) -> Grid:
    """``bins`` equal bins from the first start to the last end (start, end float64 [N], unix s)."""
    if bins < 1:
        raise ValueError(f"bins: must be at least 1, got {bins}")
    if start.size == 0:
        return Grid(0.0, 1.0, bins)
    t0, t1 = float(start.min()), float(end.max())
    return Grid(t0, max(t1 - t0, 1e-9) / bins, bins)


def bin_spans(device: np.ndarray, phase: np.ndarray, start: np.ndarray, end: np.ndarray, grid: Grid,
              devices: int, phases: int = len(PHASES)) -> np.ndarray:
    """Seconds of each phase in each (device, bin): float64 [devices, grid.bins, phases].

    device int [N] (row index 0..devices-1 of each span); phase int [N] (code 0..phases-1);
    start, end float64 [N] (unix s, end >= start).
    """
    out_size = devices * grid.bins * phases
    s = np.maximum(start.astype(np.float64), grid.t0)
    e = np.minimum(end.astype(np.float64), grid.t1)
    keep = e > s
    dev, ph, s, e = device[keep].astype(np.int64), phase[keep].astype(np.int64), s[keep], e[keep]
    if s.size == 0:
        return np.zeros((devices, grid.bins, phases))
    b0 = np.clip(np.floor((s - grid.t0) / grid.width).astype(np.int64), 0, grid.bins - 1)
    b1 = np.clip(np.ceil((e - grid.t0) / grid.width).astype(np.int64) - 1, b0, grid.bins - 1)
    counts = b1 - b0 + 1
    if int(counts.max()) == 1:  # every span inside one bin: no expansion
        flat = (dev * grid.bins + b0) * phases + ph
        return np.bincount(flat, weights=e - s, minlength=out_size).reshape(devices, grid.bins, phases)
    span = np.repeat(np.arange(s.size), counts)  # one row per (span, bin it overlaps)
    first = np.cumsum(counts) - counts
    b = b0[span] + (np.arange(span.size) - first[span])
    lo = np.maximum(s[span], grid.t0 + b * grid.width)
    hi = np.minimum(e[span], grid.t0 + (b + 1) * grid.width)
    flat = (dev[span] * grid.bins + b) * phases + ph[span]
    return np.bincount(flat, weights=np.maximum(hi - lo, 0.0), minlength=out_size).reshape(
        devices, grid.bins, phases)


def dominant(seconds: np.ndarray) -> np.ndarray:
    """int8 [D, B]: the phase with the most seconds in each cell of ``seconds`` [D, B, P]; -1
    where the cell holds no span."""
    top = np.argmax(seconds, axis=2).astype(np.int8)
    return np.where(seconds.sum(axis=2) > 0, top, np.int8(-1)).astype(np.int8)
