"""Expert loads of an MoE policy by RL phase: one compact row per (job, rank, step, phase).

``counts`` [L, E] (tokens routed to each expert of each MoE layer during the phase) is stored
as the narrowest of uint8 / uint16 / uint32 / int64 that holds its largest value, C-order
little-endian, zlib-compressed (level 1): a 58 x 256 matrix of counts below 65,536 is 29.7 KB
before compression instead of 119 KB as int64. Writes are idempotent by the key (a resent
report stores nothing twice); reads sum the rows of each phase over a step range.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.store import bulk
from moeplane.controlplane.store import rl_tables as rt

COLUMNS = ("job_id", "rank", "step", "phase", "node_id", "ts", "layers", "experts", "dtype", "tokens", "counts")
KEY = ("job_id", "rank", "step", "phase")
_WIDTHS = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"))
MAX_ROWS = 200_000  # most rows one read sums


@dataclass(frozen=True)
class PhaseLoadsRow:
    """One rank's loads in one phase of one step: ``counts`` int [L, E] >= 0; ``phase`` a
    code into PHASES; ``ts`` unix seconds when the phase ended."""

    step: int
    rank: int
    phase: int
    ts: float
    counts: np.ndarray


def encode_counts(counts: np.ndarray) -> tuple[str, bytes]:
    """(dtype string, zlib bytes) of ``counts`` int [L, E] >= 0 in its narrowest dtype."""
    top = int(counts.max()) if counts.size else 0
    dtype = next((d for d in _WIDTHS if top <= np.iinfo(d).max), np.dtype("<i8"))
    return dtype.str, zlib.compress(np.ascontiguousarray(counts, dtype=dtype).tobytes(), 1)


def decode_counts(dtype: str, blob: bytes, layers: int, experts: int) -> np.ndarray:
    """int64 [layers, experts] of a stored row."""
    return np.frombuffer(zlib.decompress(blob), dtype=np.dtype(dtype)).reshape(layers, experts).astype(np.int64)


def insert(conn: Connection, job_id: str, node_id: str, rows: Sequence[PhaseLoadsRow]) -> None:
    """INSERT ... ON CONFLICT (KEY) DO NOTHING of ``rows``, in the caller's transaction."""
    values = []
    for r in rows:
        dtype, blob = encode_counts(r.counts)
        layers, experts = r.counts.shape
        values.append((job_id, int(r.rank), int(r.step), int(r.phase), node_id, float(r.ts), int(layers),
                       int(experts), dtype, int(r.counts.sum()), blob))
    bulk.insert(conn, rt.rl_phase_loads, COLUMNS, values, ignore_conflicts_on=KEY)


@dataclass(frozen=True)
class PhaseSums:
    """A job's loads summed per phase over a step range.

    phases: the P phase codes present (ascending); counts int64 [P, L, E]; rows int [P] (rank
    and step rows summed); steps int [P] (distinct steps); ranks int [P] (distinct ranks)."""

    phases: np.ndarray
    counts: np.ndarray
    rows: np.ndarray
    steps: np.ndarray
    ranks: np.ndarray


def sum_by_phase(engine: Engine, job_id: str, step_start: int, step_end: int, *,
                 limit: int = MAX_ROWS) -> PhaseSums:
    """Loads of steps [step_start, step_end) summed per phase (at most ``limit`` rows read).
    Raises ValueError when the stored rows disagree on [L, E]."""
    c = rt.rl_phase_loads.c
    stmt = (sa.select(c.phase, c.step, c.rank, c.layers, c.experts, c.dtype, c.counts)
            .where(c.job_id == job_id, c.step >= step_start, c.step < step_end)
            .order_by(c.phase, c.step, c.rank).limit(limit))
    sums: dict[int, np.ndarray] = {}
    rows: dict[int, int] = {}
    steps: dict[int, set[int]] = {}
    ranks: dict[int, set[int]] = {}
    shape = None
    with engine.connect() as conn:
        for phase, step, rank, layers, experts, dtype, blob in conn.execute(stmt):
            if shape is None:
                shape = (layers, experts)
            elif shape != (layers, experts):
                raise ValueError(f"phase loads of job {job_id!r} disagree on [L, E]: {shape} and "
                                 f"{(layers, experts)} (step {step}, rank {rank})")
            counts = decode_counts(dtype, blob, layers, experts)
            if phase in sums:
                sums[phase] += counts
            else:
                sums[phase] = counts
            rows[phase] = rows.get(phase, 0) + 1
            steps.setdefault(phase, set()).add(step)
            ranks.setdefault(phase, set()).add(rank)
    codes = sorted(sums)
    return PhaseSums(
        np.array(codes, dtype=np.int64),
        np.stack([sums[p] for p in codes]) if codes else np.zeros((0, 0, 0), dtype=np.int64),
        np.array([rows[p] for p in codes], dtype=np.int64),
        np.array([len(steps[p]) for p in codes], dtype=np.int64),
        np.array([len(ranks[p]) for p in codes], dtype=np.int64),
    )


def latest_step(engine: Engine, job_id: str) -> int | None:
    """The newest step with stored phase loads (None: none)."""
    c = rt.rl_phase_loads.c
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.max(c.step)).where(c.job_id == job_id)).scalar()
