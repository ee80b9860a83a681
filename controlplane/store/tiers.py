"""Downsampled tiers: per-bucket statistics of raw data, and the rollups that write them.

Tiers are named by their bucket width in seconds (``TIERS`` = 60, 3600); a bucket starts at a
multiple of its width (unix seconds). Statistics per cell over a bucket: count, mean, max and
p95 (``numpy.percentile`` linear interpolation, computed in float64). Each tier is computed
from raw data, so a tier bucket equals the same bucket computed from raw.

Combining several tier rows into one wider bucket: count and sum add, max is the max; p95 is
exact for a single row and otherwise the max of the K rows' p95s, an approximation with at
most 5 % + K of the bucket's values above it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.bulk import dialect_insert
from moeplane.controlplane.store.writes import upsert

TIERS = (60, 3600)
KINDS = ("samples", "steps", "loads")
STEP_FIELDS = ("step_time_s", "host_bound_ratio")
# step_rollups.stats columns per rank
STEP_COLUMNS = (
    "count",
    "step_time_s_mean", "step_time_s_max", "step_time_s_p95",
    "host_bound_ratio_mean", "host_bound_ratio_max", "host_bound_ratio_p95",
    "tokens",
)


# ---------------------------------------------------------------- pure statistics


def cell_stats(values: np.ndarray) -> np.ndarray:
    """values float [N, ...] (NaN = not measured) → float64 [4, ...]: count, mean, max, p95.

    Cells with no finite value get count 0 and NaN statistics.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError("values: need at least one row")
    finite = np.isfinite(x)
    count = finite.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.where(count > 0, np.where(finite, x, 0.0).sum(axis=0) / count, np.nan)
        mx = np.where(count > 0, np.where(finite, x, -np.inf).max(axis=0), np.nan)
        p95 = np.nanpercentile(x, 95, axis=0)
    return np.stack([count.astype(np.float64), mean, mx, p95])


def combine_stats(stats: np.ndarray) -> np.ndarray:
    """stats [K, 4, ...] of K tier rows (count, mean, max, p95) → [4, ...] for their union."""
    s = np.asarray(stats, dtype=np.float64)
    if s.shape[0] == 1:
        return s[0].copy()
    count = s[:, 0].sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        total = np.nansum(s[:, 0] * np.nan_to_num(s[:, 1]), axis=0)
        mean = np.where(count > 0, total / count, np.nan)
        mx = np.nanmax(s[:, 2], axis=0)
        p95 = np.nanmax(s[:, 3], axis=0)
    return np.stack([count, mean, mx, p95])


def load_stats(counts: np.ndarray) -> np.ndarray:
    """counts [N, L, E] tokens per step → float64 [3, L, E]: sum, max, p95 over the N steps."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 3 or c.shape[0] == 0:
        raise ValueError(f"counts: need [N, L, E] with N >= 1, got shape {c.shape}")
    return np.stack([c.sum(axis=0), c.max(axis=0), np.percentile(c, 95, axis=0)])


def combine_load_stats(stats: np.ndarray) -> np.ndarray:
    """[K, 3, L, E] (sum, max, p95) → [3, L, E]; p95 exact for K == 1, else max of p95s
    (approximate, see the module docstring)."""
    s = np.asarray(stats, dtype=np.float64)
    if s.shape[0] == 1:
        return s[0].copy()
    return np.stack([s[:, 0].sum(axis=0), s[:, 1].max(axis=0), s[:, 2].max(axis=0)])


def empty_rank_stats(ranks: int) -> np.ndarray:
    """Statistics of ``ranks`` ranks with no step rows: float64 [ranks, 8], counts and tokens 0."""
    out = np.full((ranks, len(STEP_COLUMNS)), np.nan)
    out[:, 0] = 0
    out[:, 7] = 0
    return out


def rank_step_stats(rank: np.ndarray, step_time_s: np.ndarray, host_bound: np.ndarray,
                    tokens: np.ndarray, ranks: int) -> np.ndarray:
    """Per-rank statistics of step rows → float64 [ranks, 8] in ``STEP_COLUMNS`` order.

    rank [N] int, step_time_s [N] s, host_bound [N] ratio, tokens [N]; ranks G > max(rank).
    """
    out = empty_rank_stats(ranks)
    rank = np.asarray(rank, dtype=np.int64)
    for g in np.unique(rank):
        sel = rank == g
        st = cell_stats(np.asarray(step_time_s)[sel])
        hb = cell_stats(np.asarray(host_bound)[sel])
        out[g] = [st[0], st[1], st[2], st[3], hb[1], hb[2], hb[3], float(np.asarray(tokens)[sel].sum())]
    return out


def combine_rank_stats(stats: np.ndarray) -> np.ndarray:
    """[K, G, 8] → [G, 8]: counts and tokens add; means weighted; max; p95 as combine_stats."""
    s = np.asarray(stats, dtype=np.float64)
    if s.shape[0] == 1:
        return s[0].copy()
    out = np.empty(s.shape[1:])
    for base in (1, 4):
        block = np.stack([s[:, :, 0], s[:, :, base], s[:, :, base + 1], s[:, :, base + 2]], axis=1)
        comb = combine_stats(block)
        out[:, 0] = comb[0]
        out[:, base: base + 3] = comb[1:].T
    out[:, 7] = s[:, :, 7].sum(axis=0)
    return out


def bucket_of(ts: np.ndarray | float, width: int) -> np.ndarray:
    """Bucket start (int64 unix s) of each timestamp for buckets ``width`` seconds wide."""
    return (np.floor(np.asarray(ts, dtype=np.float64) / width) * width).astype(np.int64)


# ---------------------------------------------------------------- watermarks


def watermark(conn: Connection, kind: str, tier: int) -> float | None:
    return conn.execute(
        sa.select(t.rollup_state.c.done_until).where(t.rollup_state.c.kind == kind, t.rollup_state.c.tier == tier)
    ).scalar()


def watermarks(engine: Engine) -> dict[tuple[str, int], float]:
    with engine.connect() as conn:
        return {(r.kind, r.tier): r.done_until for r in conn.execute(sa.select(t.rollup_state))}


def _set_watermark(conn: Connection, kind: str, tier: int, until: float) -> None:
    upsert(conn, t.rollup_state, {"kind": kind, "tier": tier}, {"done_until": until})


def _upsert(conn: Connection, table: sa.Table, keys: list[str], rows: list[dict]) -> None:
    if not rows:
        return
    ins = dialect_insert(conn, table)
    cols = [c for c in rows[0] if c not in keys]
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys], set_={c: ins.excluded[c] for c in cols}
        ),
        rows,
    )


# ---------------------------------------------------------------- rollups

# the raw table each kind rolls up from (and retention deletes from)
RAW_TABLES = {"samples": t.sample_frames, "steps": t.step_stats, "loads": t.expert_loads}


def rollup(engine: Engine, kind: str, tier: int, until: float, chunk_s: float = 3600.0) -> int:
    """Roll up every complete ``tier`` bucket of ``kind`` ending at or before ``until``.

    Starts at the stored watermark (or the oldest raw row) and advances it chunk by chunk, each
    chunk in one transaction. Returns the number of tier rows written.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: one of {KINDS}, got {kind!r}")
    if tier not in TIERS:
        raise ValueError(f"tier: one of {TIERS}, got {tier}")
    end = math.floor(until / tier) * tier
    raw = RAW_TABLES[kind]
    with engine.connect() as conn:
        start = watermark(conn, kind, tier)
        if start is None:
            oldest = conn.execute(sa.select(sa.func.min(raw.c.ts))).scalar()
            start = end if oldest is None else math.floor(oldest / tier) * tier
    written = 0
    step = max(tier, math.floor(chunk_s / tier) * tier)
    a = start
    while a < end:
        b = min(end, a + step)
        with engine.begin() as conn:
            written += _ROLLERS[kind](conn, tier, a, b)
            _set_watermark(conn, kind, tier, b)
        a = b
    if start >= end:
        with engine.begin() as conn:
            _set_watermark(conn, kind, tier, max(start, end))
    return written


def _roll_samples(conn: Connection, tier: int, a: float, b: float) -> int:
    rows = conn.execute(
        sa.select(t.sample_frames.c.layout, t.sample_frames.c.ts, t.sample_frames.c["values"])
        .where(t.sample_frames.c.ts >= a, t.sample_frames.c.ts < b)
        .order_by(t.sample_frames.c.layout, t.sample_frames.c.ts)
    ).all()
    if not rows:
        return 0
    shapes = {
        r.id: (len(json.loads(r.device_ids)), len(json.loads(r.metrics)))
        for r in conn.execute(sa.select(t.sample_layouts).where(t.sample_layouts.c.id.in_({r.layout for r in rows})))
    }
    groups: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for layout, ts, blob in rows:
        groups[(layout, int(bucket_of(ts, tier)))].append(blob)
    out = []
    for (layout, bucket), blobs in groups.items():
        frames = np.stack([np.frombuffer(x, dtype="<f4").reshape(shapes[layout]) for x in blobs])
        stats = cell_stats(frames).astype("<f4")
        out.append({"tier": tier, "layout": layout, "bucket": bucket, "frames": len(blobs), "stats": stats.tobytes()})
    _upsert(conn, t.sample_rollups, ["tier", "layout", "bucket"], out)
    return len(out)


def _roll_steps(conn: Connection, tier: int, a: float, b: float) -> int:
    s = t.step_stats.c
    rows = conn.execute(
        sa.select(s.job_id, s.step, s.rank, s.ts, s.step_time_s, s.host_bound_ratio, s.tokens)
        .where(s.ts >= a, s.ts < b).order_by(s.job_id, s.ts)
    ).all()
    groups: dict[tuple[str, int], list] = defaultdict(list)
    for r in rows:
        groups[(r.job_id, int(bucket_of(r.ts, tier)))].append(r)
    out = []
    for (job_id, bucket), rs in groups.items():
        arr = np.array([(r.rank, r.step_time_s, r.host_bound_ratio, r.tokens, r.step) for r in rs], dtype=np.float64)
        ranks = int(arr[:, 0].max()) + 1
        stats = rank_step_stats(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], ranks)
        out.append({"job_id": job_id, "tier": tier, "bucket": bucket, "step_first": int(arr[:, 4].min()),
                    "step_last": int(arr[:, 4].max()), "ranks": ranks, "stats": stats.astype("<f8").tobytes()})
    _upsert(conn, t.step_rollups, ["job_id", "tier", "bucket"], out)
    return len(out)


def _roll_loads(conn: Connection, tier: int, a: float, b: float) -> int:
    e = t.expert_loads.c
    rows = conn.execute(
        sa.select(e.job_id, e.step, e.ts, e.layers, e.experts, e.counts)
        .where(e.ts >= a, e.ts < b).order_by(e.job_id, e.step)
    ).all()
    groups: dict[tuple[str, int], list] = defaultdict(list)
    for r in rows:
        groups[(r.job_id, int(bucket_of(r.ts, tier)))].append(r)
    out = []
    for (job_id, bucket), rs in groups.items():
        shape = (rs[0].layers, rs[0].experts)
        rs = [r for r in rs if (r.layers, r.experts) == shape]
        counts = np.stack([np.frombuffer(r.counts, dtype="<i8").reshape(shape) for r in rs])
        out.append({"job_id": job_id, "tier": tier, "bucket": bucket, "step_first": min(r.step for r in rs),
                    "step_last": max(r.step for r in rs), "steps": len(rs), "layers": shape[0],
                    "experts": shape[1], "stats": load_stats(counts).astype("<f8").tobytes()})
    _upsert(conn, t.load_rollups, ["job_id", "tier", "bucket"], out)
    return len(out)


_ROLLERS = {"samples": _roll_samples, "steps": _roll_steps, "loads": _roll_loads}
