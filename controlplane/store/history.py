"""History queries over any time or step range, aggregated per bucket, from raw data or tiers.

Buckets are aligned to multiples of ``bucket_s`` (unix seconds): a range's start is rounded
down and its end up to bucket edges. The source is chosen per query (:func:`plan_window`): the
coarsest tier whose width divides ``bucket_s`` and whose window still covers the start, else
raw. Buckets that a tier has not rolled up yet (newer than its watermark) come from raw, so
the newest data is always included. A page holds at most ``limit`` buckets; ``next_start``
continues it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.retention import RetentionPolicy
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store import tiers
from moeplane.controlplane.store.queries import NotFound, job_row

NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400, 604800)
DEFAULT_SPAN_S = 3600.0
MAX_BUCKETS = 10_000


@dataclass(frozen=True)
class Window:
    """One page of a query: buckets [start, end) of width bucket_s, read from ``source``
    (0 = raw, else a tier width); ``next_start`` is where the next page begins (None: done)."""

    start: int
    end: int
    bucket_s: int
    source: int
    next_start: int | None

    @property
    def source_name(self) -> str:
        return "raw" if self.source == 0 else f"{self.source}s"


def plan_window(start: float, end: float, bucket_s: int | None, limit: int, now: float,
                policy: RetentionPolicy, points: int = 500, raw_kind: str = "samples") -> Window:
    """Choose bucket width and source for [start, end) (unix s). Pure.

    bucket_s None: the smallest of ``NICE_BUCKETS`` giving at most min(points, limit) buckets,
    so the whole range fits one page.
    """
    if end <= start:
        raise ValueError("end: must be after start")
    if limit < 1 or limit > MAX_BUCKETS:
        raise ValueError(f"limit: must be in 1..{MAX_BUCKETS}, got {limit}")
    if bucket_s is None:
        want = (end - start) / min(points, limit)
        bucket_s = next((b for b in NICE_BUCKETS if b >= want), NICE_BUCKETS[-1])
    if bucket_s < 1:
        raise ValueError(f"bucket_s: must be >= 1, got {bucket_s}")

    def covers(window: float) -> bool:
        return window <= 0 or start >= now - window

    source = 0
    eligible = [w for w in sorted(tiers.TIERS, reverse=True) if bucket_s % w == 0 and covers(policy.tier_window(w))]
    if eligible:
        source = eligible[0]
    elif not covers(policy.raw_window(raw_kind)):
        for w in sorted(tiers.TIERS):
            if covers(policy.tier_window(w)):
                source, bucket_s = w, math.ceil(bucket_s / w) * w
                break
    first = math.floor(start / bucket_s) * bucket_s
    last = math.ceil(end / bucket_s) * bucket_s
    page_end = min(last, first + limit * bucket_s)
    return Window(first, page_end, bucket_s, source, page_end if page_end < last else None)


def _split(win: Window, mark: float | None) -> int:
    """Edge between tier buckets (before) and raw buckets (after) of a page."""
    if win.source == 0:
        return win.start
    done = math.floor((mark or 0.0) / win.bucket_s) * win.bucket_s
    return max(win.start, min(win.end, done))


def _mark(conn: Connection, kind: str, tier: int) -> float | None:
    return tiers.watermark(conn, kind, tier) if tier else None


def _header(win: Window, split: int) -> dict:
    """``source`` is the tier chosen; buckets from ``raw_from`` on were not rolled up yet and
    come from raw data."""
    return {"bucket_s": win.bucket_s, "source": win.source_name, "start": win.start, "end": win.end,
            "next_start": win.next_start, "raw_from": split}


# ---------------------------------------------------------------- device metrics


def device_metric(engine: Engine, device_id: str, metric: str, win: Window) -> dict:
    """count/mean/max/p95 of one device metric per bucket (value units as the metric's name)."""
    with engine.connect() as conn:
        node = conn.execute(sa.select(t.devices.c.node_id).where(t.devices.c.device_id == device_id)).scalar()
        if node is None:
            raise NotFound(f"device {device_id!r}")
        cells = {}
        for lay in conn.execute(sa.select(t.sample_layouts).where(t.sample_layouts.c.node_id == node)):
            devs, mets = json.loads(lay.device_ids), json.loads(lay.metrics)
            if device_id in devs and metric in mets:
                cells[lay.id] = (len(devs), len(mets), devs.index(device_id), mets.index(metric))
        if not cells:
            known = conn.execute(sa.select(t.sample_layouts.c.metrics)).scalars().all()
            if not any(metric in json.loads(m) for m in known):
                raise NotFound(f"metric {metric!r}")
        split = _split(win, _mark(conn, "samples", win.source))
        per_bucket: dict[int, list[np.ndarray]] = defaultdict(list)
        if cells and split > win.start:
            r = t.sample_rollups.c
            for row in conn.execute(
                sa.select(r.layout, r.bucket, r.stats).where(
                    r.tier == win.source, r.layout.in_(list(cells)), r.bucket >= win.start, r.bucket < split)
            ):
                d, m, di, mi = cells[row.layout]
                stats = np.frombuffer(row.stats, dtype="<f4").reshape(4, d, m)[:, di, mi]
                per_bucket[int(tiers.bucket_of(row.bucket, win.bucket_s))].append(stats)
        raw: dict[int, list[float]] = defaultdict(list)
        if cells and split < win.end:
            f = t.sample_frames.c
            for row in conn.execute(
                sa.select(f.layout, f.ts, f["values"]).where(
                    f.layout.in_(list(cells)), f.ts >= split, f.ts < win.end)
            ):
                d, m, di, mi = cells[row.layout]
                raw[int(tiers.bucket_of(row.ts, win.bucket_s))].append(
                    float(np.frombuffer(row[2], dtype="<f4").reshape(d, m)[di, mi]))
    items = []
    for b in sorted(set(per_bucket) | set(raw)):
        s = tiers.combine_stats(np.stack(per_bucket[b])) if b in per_bucket else tiers.cell_stats(
            np.asarray(raw[b], dtype=np.float32))
        if s[0] > 0:
            items.append({"start": b, "count": int(s[0]), "mean": float(s[1]), "max": float(s[2]),
                          "p95": float(s[3])})
    return _header(win, split) | {"device_id": device_id, "metric": metric, "items": items}


# ---------------------------------------------------------------- step statistics


def step_stats(engine: Engine, job_id: str, win: Window, rank: int | None = None,
               steps: tuple[int | None, int | None] = (None, None)) -> dict:
    """Per bucket and rank: count, step_time_s and host_bound_ratio mean/max/p95, tokens sum.

    ``steps`` [first, end) filters raw rows by step and tier rows by their step span.
    """
    s0, s1 = steps
    with engine.connect() as conn:
        job_row(conn, job_id)
        split = _split(win, _mark(conn, "steps", win.source))
        per_bucket: dict[int, list[np.ndarray]] = defaultdict(list)
        if split > win.start:
            r = t.step_rollups.c
            q = sa.select(r.bucket, r.ranks, r.stats).where(
                r.job_id == job_id, r.tier == win.source, r.bucket >= win.start, r.bucket < split)
            if s0 is not None:
                q = q.where(r.step_last >= s0)
            if s1 is not None:
                q = q.where(r.step_first < s1)
            for row in conn.execute(q):
                per_bucket[int(tiers.bucket_of(row.bucket, win.bucket_s))].append(
                    np.frombuffer(row.stats, dtype="<f8").reshape(row.ranks, len(tiers.STEP_COLUMNS)))
        raw: dict[int, list] = defaultdict(list)
        if split < win.end:
            c = t.step_stats.c
            q = sa.select(c.rank, c.ts, c.step_time_s, c.host_bound_ratio, c.tokens).where(
                c.job_id == job_id, c.ts >= split, c.ts < win.end)
            if s0 is not None:
                q = q.where(c.step >= s0)
            if s1 is not None:
                q = q.where(c.step < s1)
            if rank is not None:
                q = q.where(c.rank == rank)
            for row in conn.execute(q):
                raw[int(tiers.bucket_of(row.ts, win.bucket_s))].append(
                    (row.rank, row.step_time_s, row.host_bound_ratio, row.tokens))
    items = []
    for b in sorted(set(per_bucket) | set(raw)):
        if b in per_bucket:
            width = max(x.shape[0] for x in per_bucket[b])
            padded = [np.vstack([x, tiers.empty_rank_stats(width - x.shape[0])]) for x in per_bucket[b]]
            stats = tiers.combine_rank_stats(np.stack(padded))
        else:
            arr = np.array(raw[b], dtype=np.float64)
            stats = tiers.rank_step_stats(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], int(arr[:, 0].max()) + 1)
        for g in range(stats.shape[0]) if rank is None else [rank]:
            if g >= stats.shape[0] or stats[g, 0] <= 0:
                continue
            row = dict(zip(tiers.STEP_COLUMNS, (float(v) for v in stats[g]), strict=True))
            items.append({"start": b, "rank": g} | row | {"count": int(row["count"]), "tokens": int(row["tokens"])})
    return _header(win, split) | {"job_id": job_id, "items": items}


def steps_to_time(engine: Engine, job_id: str, step_start: int | None, step_end: int | None) -> tuple[float, float] | None:
    """Time span [first ts, last ts + 1 s) of a job's steps in [step_start, step_end), from raw
    loads and step statistics, else from tiers. None when no such step is known."""
    lo, hi = [], []
    with engine.connect() as conn:
        for table in (t.expert_loads, t.step_stats):
            q = sa.select(sa.func.min(table.c.ts), sa.func.max(table.c.ts)).where(table.c.job_id == job_id)
            if step_start is not None:
                q = q.where(table.c.step >= step_start)
            if step_end is not None:
                q = q.where(table.c.step < step_end)
            a, b = conn.execute(q).one()
            if a is not None:
                lo.append(a)
                hi.append(b)
        for table in (t.load_rollups, t.step_rollups):
            q = sa.select(sa.func.min(table.c.bucket), sa.func.max(table.c.bucket + table.c.tier)).where(
                table.c.job_id == job_id)
            if step_start is not None:
                q = q.where(table.c.step_last >= step_start)
            if step_end is not None:
                q = q.where(table.c.step_first < step_end)
            a, b = conn.execute(q).one()
            if a is not None:
                lo.append(float(a))
                hi.append(float(b) - 1.0)
    if not lo:
        return None
    return min(lo), max(hi) + 1.0
