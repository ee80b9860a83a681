"""Per-(step, device) phase seconds: the summary kept at ingest for long timelines.

A summary is an array of :func:`record_dtype` records, one per (step, rank): the rank's role,
first span start and last span end in the step, how many spans it holds, and the seconds of
each phase (float64, the sum of the spans' durations: exact up to float rounding). A stored
row holds one node's records of one step as the records' little-endian bytes (packed, no
padding). Pure numpy: no loop over spans or records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.rl.phases import PHASES


def record_dtype(phases: int = len(PHASES)) -> np.dtype:
    """One (step, rank) record: first, last float64 (unix s); rank int32; role int8 (the
    highest code seen); spans int32; seconds float64 [phases]. Packed: 25 + 8 * phases bytes."""
    return np.dtype([("first", "<f8"), ("last", "<f8"), ("rank", "<i4"), ("role", "i1"), ("spans", "<i4"),
                     ("seconds", "<f8", (phases,))])


def summarize(step, rank, role, phase, start, end, phases: int = len(PHASES)) -> tuple[np.ndarray, np.ndarray]:
    """(steps int64 [K], records [K] of :func:`record_dtype`): the N spans (step int [N], rank
    int [N], role int [N], phase int [N] codes < ``phases``, start/end float64 [N] unix s)
    summed per (step, rank); sorted by step, then rank."""
    step, rank = np.asarray(step, dtype=np.int64), np.asarray(rank, dtype=np.int64)
    if step.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=record_dtype(phases))
    keys, cell = np.unique((step << 32) + (rank + 2**31), return_inverse=True)  # rank: int32
    cell = cell.reshape(-1)
    k = keys.size
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    out = np.zeros(k, dtype=record_dtype(phases))
    out["rank"] = (keys & 0xFFFFFFFF) - 2**31
    out["first"], out["last"] = np.inf, -np.inf
    np.minimum.at(out["first"], cell, start)
    np.maximum.at(out["last"], cell, end)
    roles = np.full(k, -1, dtype=np.int8)
    np.maximum.at(roles, cell, np.asarray(role, dtype=np.int8))
    out["role"] = roles
    out["spans"] = np.bincount(cell, minlength=k)
    flat = cell * phases + np.asarray(phase, dtype=np.int64)
    out["seconds"] = np.bincount(flat, weights=end - start, minlength=k * phases).reshape(k, phases)
    return keys >> 32, out


def merge(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The records of one step: ``old`` and ``new`` (record arrays, any phase widths) added per
    rank (min first, max last, max role, summed spans and seconds); sorted by rank."""
    phases = max(old.dtype["seconds"].shape[0], new.dtype["seconds"].shape[0])
    both = np.concatenate([widen(old, phases), widen(new, phases)])
    ranks, cell = np.unique(both["rank"], return_inverse=True)
    cell = cell.reshape(-1)
    out = np.zeros(ranks.size, dtype=record_dtype(phases))
    out["rank"] = ranks
    out["first"], out["last"], out["role"] = np.inf, -np.inf, -1
    np.minimum.at(out["first"], cell, both["first"])
    np.maximum.at(out["last"], cell, both["last"])
    roles = out["role"].copy()
    np.maximum.at(roles, cell, both["role"])
    out["role"] = roles
    out["spans"] = np.bincount(cell, weights=both["spans"], minlength=ranks.size).astype(np.int32)
    seconds = np.zeros((ranks.size, phases))
    np.add.at(seconds, cell, both["seconds"])
    out["seconds"] = seconds
    return out


def widen(records: np.ndarray, phases: int) -> np.ndarray:
    """``records`` with ``phases`` phase columns (new phases zero)."""
    have = records.dtype["seconds"].shape[0]
    if have == phases:
        return records
    if have > phases:
        raise ValueError(f"records: {have} phases, more than the {phases} asked for")
    out = np.zeros(records.size, dtype=record_dtype(phases))
    for name in ("first", "last", "rank", "role", "spans"):
        out[name] = records[name]
    out["seconds"][:, :have] = records["seconds"]
    return out


@dataclass(frozen=True)
class StepGrid:
    """S steps x D devices (step-major, the order of the stored records). steps int64 [S]
    ascending; ranks int32 [D] ascending (-1: the job's timers); roles int8 [D]; seconds
    float64 [S, D, P] (phase seconds, P = len(PHASES)); present bool [S, D] (the device has a
    span in the step); wall float64 [S] (the step's first start to its last end over every
    device, s); spans int (all spans counted)."""

    steps: np.ndarray
    ranks: np.ndarray
    roles: np.ndarray
    seconds: np.ndarray
    present: np.ndarray
    wall: np.ndarray
    spans: int

    def idle(self) -> np.ndarray:
        """float64 [S, D]: the step's wall minus the device's phase seconds (at least 0; NaN
        where the device has no span in the step)."""
        busy = self.seconds.sum(axis=2)
        return np.where(self.present, np.maximum(self.wall[:, None] - busy, 0.0), np.nan)

    def dominant(self) -> tuple[np.ndarray, np.ndarray]:
        """(int8 [S, D] the phase with the most seconds, -1 where no span; float64 [S, D] its
        seconds)."""
        top = np.argmax(self.seconds, axis=2).astype(np.int8)
        return np.where(self.present, top, np.int8(-1)), self.seconds.max(axis=2)


def grid(step: np.ndarray, records: np.ndarray) -> StepGrid:
    """The step x device grid of records (step int64 [K], records [K] of :func:`record_dtype`
    with len(PHASES) phases); a rank summarized under two nodes adds up. Records already in
    step-major cell order (one node per step, or nodes in rank order) are used in place; else
    each cell is written by assignment, or with ``ufunc.at`` when some cell has two records."""
    phases = len(PHASES)
    steps, si = np.unique(np.asarray(step, dtype=np.int64), return_inverse=True)
    ranks, di = np.unique(records["rank"], return_inverse=True)
    d, s = ranks.size, steps.size
    cell = si.reshape(-1) * d + di.reshape(-1)
    spans = int(records["spans"].sum())
    if cell.size == d * s and (cell == np.arange(d * s)).all():  # every cell once, in order
        wall = (records["last"].reshape(s, d).max(axis=1, initial=-np.inf)
                - records["first"].reshape(s, d).min(axis=1, initial=np.inf))
        return StepGrid(steps, ranks.astype(np.int32), records["role"].reshape(s, d).max(axis=0, initial=-1),
                        np.ascontiguousarray(records["seconds"]).reshape(s, d, phases), np.ones((s, d), dtype=bool),
                        wall, spans)
    counts = np.bincount(cell, minlength=d * s)
    seconds = np.zeros((d * s, phases))
    first, last = np.full(d * s, np.inf), np.full(d * s, -np.inf)
    role = np.full(d * s, -1, dtype=np.int8)
    if counts.max(initial=0) <= 1:
        seconds[cell], first[cell], last[cell], role[cell] = (
            records["seconds"], records["first"], records["last"], records["role"])
    else:
        np.add.at(seconds, cell, records["seconds"])
        np.minimum.at(first, cell, records["first"])
        np.maximum.at(last, cell, records["last"])
        np.maximum.at(role, cell, records["role"])
    wall = last.reshape(s, d).max(axis=1, initial=-np.inf) - first.reshape(s, d).min(axis=1, initial=np.inf)
    return StepGrid(steps, ranks.astype(np.int32), role.reshape(s, d).max(axis=0, initial=-1),
                    seconds.reshape(s, d, phases), (counts > 0).reshape(s, d), wall, spans)
