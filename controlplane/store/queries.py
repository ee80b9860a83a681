"""Read queries: the one service layer behind both REST and the dashboard.

Every function takes an Engine and returns plain data (dicts, lists, numpy arrays).
Errors: :class:`NotFound` for an unknown job/device; ``ValueError`` for bad ranges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import tables as t

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


def job_row(conn, job_id: str):
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


def require_job(engine: Engine, job_id: str) -> None:
    """Raise NotFound unless ``job_id`` is known (one row; ``get_job`` also lists its nodes)."""
    with engine.connect() as conn:
        job_row(conn, job_id)


def latest_step(engine: Engine, job_id: str) -> int | None:
    """The newest step of ``job_id`` with stored loads (None: none yet)."""
    with engine.connect() as conn:
        return _latest_step(conn, job_id)


def _latest_step(conn, job_id: str) -> int | None:
    return conn.execute(
        sa.select(sa.func.max(t.expert_loads.c.step)).where(t.expert_loads.c.job_id == job_id)
    ).scalar()


def newest_step(engine: Engine, job_id: str) -> int | None:
    """The newest step of ``job_id`` with stored loads or step statistics (None: neither yet)."""
    with engine.connect() as conn:
        steps = (_latest_step(conn, job_id), conn.execute(
            sa.select(sa.func.max(t.step_stats.c.step)).where(t.step_stats.c.job_id == job_id)
        ).scalar())
    return max((s for s in steps if s is not None), default=None)


def get_job(engine: Engine, job_id: str) -> dict:
    with engine.connect() as conn:
        row = job_row(conn, job_id)
        latest = _latest_step(conn, job_id)
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


def count_nodes(engine: Engine, job_id: str) -> int:
    """How many nodes serve ``job_id`` (one COUNT: the controller asks every tick)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(t.nodes).where(t.nodes.c.job_id == job_id)
        ).scalar_one()


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


def decode_frame(values: bytes, layout) -> tuple[list[str], list[str], np.ndarray]:
    """A raw frame's device ids [D], metric names [M] and values float32 [D, M] (NaN: none)."""
    devices = json.loads(layout.device_ids)
    metrics = json.loads(layout.metrics)
    return devices, metrics, np.frombuffer(values, dtype="<f4").reshape(len(devices), len(metrics))


def frame_device_values(node_id: str, ts: float, values: bytes, layout) -> dict[str, dict]:
    """{device_id: {"node_id", "ts", "metrics": {name: value}}} of one frame, measured values only."""
    devices, metrics, arr = decode_frame(values, layout)
    finite = np.isfinite(arr)
    return {
        dev: {
            "node_id": node_id,
            "ts": ts,
            "metrics": {m: float(arr[di, mi]) for mi, m in enumerate(metrics) if finite[di, mi]},
        }
        for di, dev in enumerate(devices)
    }


def latest_device_values(engine: Engine, job_id: str | None = None) -> dict[str, dict]:
    """{device_id: {"node_id", "ts", "metrics": {name: value}}} from each node's newest frame."""
    q = sa.select(t.node_latest.c.node_id, t.node_latest.c.ts, t.node_latest.c["values"],
                  t.sample_layouts.c.device_ids, t.sample_layouts.c.metrics).join(
        t.sample_layouts, t.sample_layouts.c.id == t.node_latest.c.layout
    )
    if job_id is not None:
        q = q.join(t.nodes, t.nodes.c.node_id == t.node_latest.c.node_id).where(t.nodes.c.job_id == job_id)
    out: dict[str, dict] = {}
    with engine.connect() as conn:
        for row in conn.execute(q):
            out.update(frame_device_values(row.node_id, row.ts, row[2], row))
    return out


def device_history(engine: Engine, device_id: str, metric: str | None, rng: Range) -> list[dict]:
    """Raw samples of one device, oldest first: [{"ts", "metric", "value"}] (metric order by name)."""
    with engine.connect() as conn:
        node = conn.execute(sa.select(t.devices.c.node_id).where(t.devices.c.device_id == device_id)).scalar()
        if node is None:
            raise NotFound(f"device {device_id!r}")
        layouts = {}
        for lay in conn.execute(sa.select(t.sample_layouts).where(t.sample_layouts.c.node_id == node)):
            devices, metrics = json.loads(lay.device_ids), json.loads(lay.metrics)
            if device_id in devices and (metric is None or metric in metrics):
                layouts[lay.id] = (devices.index(device_id), metrics, len(devices))
        if metric is not None and not layouts:
            known = conn.execute(sa.select(t.sample_layouts.c.metrics)).scalars().all()
            if not any(metric in json.loads(m) for m in known):
                raise NotFound(f"metric {metric!r}")
        if not layouts:
            return []
        fq = (
            sa.select(t.sample_frames.c.layout, t.sample_frames.c.ts, t.sample_frames.c["values"])
            .where(t.sample_frames.c.layout.in_(list(layouts)))
            .order_by(t.sample_frames.c.ts)
            .limit(rng.limit)
        )
        if rng.start is not None:
            fq = fq.where(t.sample_frames.c.ts >= rng.start)
        if rng.end is not None:
            fq = fq.where(t.sample_frames.c.ts < rng.end)
        frames = conn.execute(fq).all()
    out: list[dict] = []
    for layout, ts, blob in frames:
        di, metrics, n_dev = layouts[layout]
        row = np.frombuffer(blob, dtype="<f4").reshape(n_dev, len(metrics))[di]
        for mi in sorted(range(len(metrics)), key=lambda i: metrics[i]):
            if (metric is None or metrics[mi] == metric) and np.isfinite(row[mi]):
                out.append({"ts": ts, "metric": metrics[mi], "value": float(row[mi])})
    return out[: rng.limit]


def sample_count(engine: Engine) -> int:
    """Measured (non-NaN) raw samples stored; decodes every frame (tests and benchmarks)."""
    total = 0
    with engine.connect() as conn:
        for (blob,) in conn.execute(sa.select(t.sample_frames.c["values"])):
            total += int(np.isfinite(np.frombuffer(blob, dtype="<f4")).sum())
    return total


def _decode_counts(row) -> np.ndarray:
    return np.frombuffer(row.counts, dtype="<i8").reshape(row.layers, row.experts)


def latest_loads(engine: Engine, job_id: str) -> dict | None:
    """The newest global load matrix of a job: {"step", "ts", "nodes_reported", "counts" [L, E]}."""
    with engine.connect() as conn:
        job_row(conn, job_id)
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
        job = job_row(conn, job_id)
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
        job_row(conn, job_id)
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
