"""Read queries: the one service layer behind both REST and the dashboard.

Every function takes an Engine and returns plain data (dicts, lists, numpy arrays).
Errors: :class:`NotFound` for an unknown job/device; ``ValueError`` for bad ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from controlplane.store import tables as t

MAX_LIMIT = 10_000


class NotFound(LookupError):
    """An id that names nothing in the store. ``what`` is e.g. ``"job 'j1'"``."""

    def __init__(self, what: str):
        super().__init__(f"{what} not found")
        self.what = what


@dataclass(frozen=True)
class Range:
    """A half-open selection: time [start, end) in unix seconds and/or step [step_start, step_end)."""

    start: float | None = None
    end: float | None = None
    step_start: int | None = None
    step_end: int | None = None
    limit: int = 1000

    def __post_init__(self):
        if self.limit < 1 or self.limit > MAX_LIMIT:
            raise ValueError(f"limit: must be in 1..{MAX_LIMIT}, got {self.limit}")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise ValueError("end: must not be before start")
        if self.step_start is not None and self.step_end is not None and self.step_end < self.step_start:
            raise ValueError("step_end: must not be before step_start")


def _job_row(conn, job_id: str):
    row = conn.execute(sa.select(t.jobs).where(t.jobs.c.job_id == job_id)).mappings().first()
    if row is None:
        raise NotFound(f"job {job_id!r}")
    return row


def list_jobs(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.jobs).order_by(t.jobs.c.job_id)).mappings().all()
        latest = dict(
            conn.execute(
                sa.select(t.expert_loads.c.job_id, sa.func.max(t.expert_loads.c.step)).group_by(
                    t.expert_loads.c.job_id
                )
            ).all()
        )
    return [dict(r) | {"latest_step": latest.get(r["job_id"])} for r in rows]


def get_job(engine: Engine, job_id: str) -> dict:
    with engine.connect() as conn:
        row = _job_row(conn, job_id)
        latest = conn.execute(
            sa.select(sa.func.max(t.expert_loads.c.step)).where(t.expert_loads.c.job_id == job_id)
        ).scalar()
        nodes = conn.execute(
            sa.select(t.nodes.c.node_id).where(t.nodes.c.job_id == job_id).order_by(t.nodes.c.node_id)
        ).scalars().all()
    return dict(row) | {"latest_step": latest, "nodes": list(nodes)}


def list_nodes(engine: Engine, job_id: str | None = None) -> list[dict]:
    q = sa.select(t.nodes).order_by(t.nodes.c.node_id)
    if job_id is not None:
        q = q.where(t.nodes.c.job_id == job_id)
    with engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    return [
        dict(r) | {"ranks": [int(x) for x in r["ranks"].split(",") if x]}
        for r in rows
    ]


def list_devices(engine: Engine, node_id: str | None = None, job_id: str | None = None) -> list[dict]:
    q = sa.select(
        t.devices.c.device_id,
        t.devices.c.node_id,
        t.devices.c.idx.label("index"),
        t.devices.c.kind,
        t.devices.c.model,
        t.devices.c.memory_total_bytes,
        t.devices.c.rank,
    ).order_by(t.devices.c.node_id, t.devices.c.idx)
    if node_id is not None:
        q = q.where(t.devices.c.node_id == node_id)
    if job_id is not None:
        q = q.join(t.nodes, t.nodes.c.node_id == t.devices.c.node_id).where(t.nodes.c.job_id == job_id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings().all()]


def latest_device_values(engine: Engine, job_id: str | None = None) -> dict[str, dict]:
    """{device_id: {"node_id", "ts", "metrics": {name: value}}} from the latest-value table."""
    q = (
        sa.select(
            t.devices.c.device_id,
            t.devices.c.node_id,
            t.metrics.c.name,
            t.device_latest.c.ts,
            t.device_latest.c.value,
        )
        .join(t.devices, t.devices.c.id == t.device_latest.c.device)
        .join(t.metrics, t.metrics.c.id == t.device_latest.c.metric)
    )
    if job_id is not None:
        q = q.join(t.nodes, t.nodes.c.node_id == t.devices.c.node_id).where(t.nodes.c.job_id == job_id)
    out: dict[str, dict] = {}
    with engine.connect() as conn:
        for device_id, node_id, name, ts, value in conn.execute(q):
            d = out.setdefault(device_id, {"node_id": node_id, "ts": ts, "metrics": {}})
            d["metrics"][name] = value
            d["ts"] = max(d["ts"], ts)
    return out


def device_history(engine: Engine, device_id: str, metric: str | None, rng: Range) -> list[dict]:
    """Raw samples of one device, oldest first: [{"ts", "metric", "value"}]."""
    with engine.connect() as conn:
        dev = conn.execute(sa.select(t.devices.c.id).where(t.devices.c.device_id == device_id)).scalar()
        if dev is None:
            raise NotFound(f"device {device_id!r}")
        q = (
            sa.select(t.device_samples.c.ts, t.metrics.c.name.label("metric"), t.device_samples.c.value)
            .join(t.metrics, t.metrics.c.id == t.device_samples.c.metric)
            .where(t.device_samples.c.device == dev)
            .order_by(t.device_samples.c.ts, t.metrics.c.name)
            .limit(rng.limit)
        )
        if metric is not None:
            mid = conn.execute(sa.select(t.metrics.c.id).where(t.metrics.c.name == metric)).scalar()
            if mid is None:
                raise NotFound(f"metric {metric!r}")
            q = q.where(t.device_samples.c.metric == mid)
        if rng.start is not None:
            q = q.where(t.device_samples.c.ts >= rng.start)
        if rng.end is not None:
            q = q.where(t.device_samples.c.ts < rng.end)
        return [dict(r) for r in conn.execute(q).mappings().all()]


def metric_names(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(t.metrics.c.name).order_by(t.metrics.c.name)).scalars())


def _decode_counts(row) -> np.ndarray:
    return np.frombuffer(row.counts, dtype="<i8").reshape(row.layers, row.experts)


def latest_loads(engine: Engine, job_id: str) -> dict | None:
    """The newest global load matrix of a job: {"step", "ts", "nodes_reported", "counts" [L, E]}."""
    with engine.connect() as conn:
        _job_row(conn, job_id)
        row = conn.execute(
            sa.select(t.expert_loads)
            .where(t.expert_loads.c.job_id == job_id)
            .order_by(t.expert_loads.c.step.desc())
            .limit(1)
        ).first()
    if row is None:
        return None
    return {"step": row.step, "ts": row.ts, "nodes_reported": row.nodes_reported, "counts": _decode_counts(row)}


def loads_history(engine: Engine, job_id: str, rng: Range, layer: int | None = None) -> list[dict]:
    """Global loads per step, oldest first; ``counts`` [L, E] (or [E] for one ``layer``)."""
    with engine.connect() as conn:
        job = _job_row(conn, job_id)
        if layer is not None and job["layers"] is not None and not 0 <= layer < job["layers"]:
            raise ValueError(f"layer: must be in 0..{job['layers'] - 1}, got {layer}")
        q = (
            sa.select(t.expert_loads)
            .where(t.expert_loads.c.job_id == job_id)
            .order_by(t.expert_loads.c.step)
            .limit(rng.limit)
        )
        q = _ranged(q, t.expert_loads, rng)
        rows = conn.execute(q).all()
    out = []
    for row in rows:
        counts = _decode_counts(row)
        out.append(
            {
                "step": row.step,
                "ts": row.ts,
                "nodes_reported": row.nodes_reported,
                "counts": counts if layer is None else counts[layer],
            }
        )
    return out


def step_stats_history(engine: Engine, job_id: str, rng: Range, rank: int | None = None) -> list[dict]:
    with engine.connect() as conn:
        _job_row(conn, job_id)
        q = (
            sa.select(t.step_stats)
            .where(t.step_stats.c.job_id == job_id)
            .order_by(t.step_stats.c.step, t.step_stats.c.rank)
            .limit(rng.limit)
        )
        if rank is not None:
            q = q.where(t.step_stats.c.rank == rank)
        q = _ranged(q, t.step_stats, rng)
        return [dict(r) for r in conn.execute(q).mappings().all()]


def count_rows(engine: Engine, table: str, **where) -> int:
    """Row count of a table with equality filters; used by tests and benchmarks."""
    tab = t.metadata.tables[table]
    q = sa.select(sa.func.count()).select_from(tab)
    for k, v in where.items():
        q = q.where(tab.c[k] == v)
    with engine.connect() as conn:
        return int(conn.execute(q).scalar())


def _ranged(q, table: sa.Table, rng: Range):
    if rng.start is not None:
        q = q.where(table.c.ts >= rng.start)
    if rng.end is not None:
        q = q.where(table.c.ts < rng.end)
    if rng.step_start is not None:
        q = q.where(table.c.step >= rng.step_start)
    if rng.step_end is not None:
        q = q.where(table.c.step < rng.step_end)
    return q
