"""Expert-load history per bucket: the whole [L, E] matrix, one layer, one expert, or the load
of each EP rank under the placement that was running at each step.

Aggregation over a bucket's steps: ``mean``, ``max`` or ``p95`` of tokens per step. The
placement at step s comes from :mod:`moeplane.controlplane.store.placements`. Rank loads are computed per step from raw loads (kept ``loads_retention_s``); a logical
expert's tokens split evenly across its replicas.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.balancing.placement import gpu_loads
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store import tiers
from moeplane.controlplane.store.history import Window, _header, _mark, _split
from moeplane.controlplane.store.placements import Placement, PlacementSource
from moeplane.controlplane.store.queries import job_row

VIEWS = ("matrix", "layer", "expert", "ranks")
AGGS = ("mean", "max", "p95")


def _aggregate(per_step: np.ndarray, agg: str) -> np.ndarray:
    if agg == "mean":
        return per_step.mean(axis=0)
    if agg == "max":
        return per_step.max(axis=0)
    return np.percentile(per_step, 95, axis=0)


def _select(values: np.ndarray, view: str, layer: int | None, expert: int | None):
    """values [L, E] → the view's slice as nested lists / a float."""
    if layer is not None:
        values = values[layer]
        return float(values[expert]) if expert is not None else values.tolist()
    if expert is not None:
        return values[:, expert].tolist()
    return values.tolist()


def load_history(engine: Engine, job_id: str, win: Window, *, view: str = "matrix", agg: str = "mean",
                 layer: int | None = None, expert: int | None = None,
                 steps: tuple[int | None, int | None] = (None, None),
                 placements: PlacementSource | None = None) -> dict:
    """Items per bucket: {start, steps, step_first, step_last, values}. ``values``: matrix
    [L, E]; layer [E]; expert [L] (a number with ``layer``); ranks [G] (summed over layers, or
    of one ``layer``). Units: tokens per step."""
    if view not in VIEWS:
        raise ValueError(f"view: one of {VIEWS}, got {view!r}")
    if agg not in AGGS:
        raise ValueError(f"agg: one of {AGGS}, got {agg!r}")
    if view == "layer" and layer is None:
        raise ValueError("layer: required for view=layer")
    if view == "expert" and expert is None:
        raise ValueError("expert: required for view=expert")
    s0, s1 = steps
    with engine.connect() as conn:
        job = dict(job_row(conn, job_id))
        if layer is not None and job["layers"] is not None and not 0 <= layer < job["layers"]:
            raise ValueError(f"layer: must be in 0..{job['layers'] - 1}, got {layer}")
        if expert is not None and job["experts"] is not None and not 0 <= expert < job["experts"]:
            raise ValueError(f"expert: must be in 0..{job['experts'] - 1}, got {expert}")
        split = win.start if view == "ranks" else _split(win, _mark(conn, "loads", win.source))
        tier_rows: dict[int, list] = defaultdict(list)
        if split > win.start:
            r = t.load_rollups.c
            q = sa.select(r.bucket, r.steps, r.step_first, r.step_last, r.layers, r.experts, r.stats).where(
                r.job_id == job_id, r.tier == win.source, r.bucket >= win.start, r.bucket < split)
            if s0 is not None:
                q = q.where(r.step_last >= s0)
            if s1 is not None:
                q = q.where(r.step_first < s1)
            for row in conn.execute(q):
                tier_rows[int(tiers.bucket_of(row.bucket, win.bucket_s))].append(row)
        raw: dict[int, list] = defaultdict(list)
        if split < win.end:
            e = t.expert_loads.c
            q = sa.select(e.step, e.ts, e.layers, e.experts, e.counts).where(
                e.job_id == job_id, e.ts >= split, e.ts < win.end).order_by(e.step)
            if s0 is not None:
                q = q.where(e.step >= s0)
            if s1 is not None:
                q = q.where(e.step < s1)
            for row in conn.execute(q):
                raw[int(tiers.bucket_of(row.ts, win.bucket_s))].append(row)
    source = placements or PlacementSource(engine)
    items = []
    for b in sorted(set(tier_rows) | set(raw)):
        if b in tier_rows:
            rows = tier_rows[b]
            shape = (rows[0].layers, rows[0].experts)
            stats = tiers.combine_load_stats(np.stack(
                [np.frombuffer(r.stats, dtype="<f8").reshape(3, *shape) for r in rows if (r.layers, r.experts) == shape]))
            n = sum(r.steps for r in rows)
            first, last = min(r.step_first for r in rows), max(r.step_last for r in rows)
            values = stats[0] / n if agg == "mean" else stats[1 if agg == "max" else 2]
        else:
            rows = raw[b]
            counts = np.stack([np.frombuffer(r.counts, dtype="<i8").reshape(r.layers, r.experts) for r in rows])
            n, first, last = len(rows), rows[0].step, rows[-1].step
            if view == "ranks":
                ran = source.at_steps(dict(job), [r.step for r in rows])
                if ran is None:
                    raise ValueError("view: ranks needs the job's geometry (world size), not known yet")
                per_step = np.stack([_ranks_of(c, p, layer) for c, p in zip(counts, ran, strict=True)])
                items.append({"start": b, "steps": n, "step_first": first, "step_last": last,
                              "values": _aggregate(per_step, agg).tolist()})
                continue
            values = _aggregate(counts.astype(np.float64), agg)
        items.append({"start": b, "steps": n, "step_first": first, "step_last": last,
                      "values": _select(values, view, layer, expert)})
    return _header(win, split) | {"job_id": job_id, "view": view, "agg": agg, "items": items}


def _ranks_of(counts: np.ndarray, placement: Placement, layer: int | None) -> np.ndarray:
    """Tokens per rank [G] (summed over layers, or of ``layer``) of one step's ``counts``
    [L, E] under the placement that ran at that step."""
    if placement.phy2log.shape[0] != counts.shape[0]:
        raise ValueError("view: ranks needs a placement matching the loads' layers")
    per_layer = gpu_loads(counts, placement.phy2log, placement.geometry.ranks)
    return per_layer[layer] if layer is not None else per_layer.sum(axis=0)
