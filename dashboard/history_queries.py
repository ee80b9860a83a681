"""Store reads for the History page's cluster view: device values at a past time.

Raw telemetry is one float32 [D, M] frame per node and round in ``sample_frames`` (little
endian, NaN = not measured), its device and metric names in ``sample_layouts``; the same
decoding as ``moeplane.controlplane.store.queries.latest_device_values``, but for the newest frame of
each node at or before a given time instead of the live ``node_latest`` row.
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.queries import Range, frame_device_values

DEFAULT_MAX_AGE_S = 120.0


def device_values_at(
    engine: Engine, at: float, *, job_id: str | None = None, max_age_s: float = DEFAULT_MAX_AGE_S
) -> dict[str, dict]:
    """Each device's values as of ``at`` (unix seconds): ``{device_id: {"node_id", "ts",
    "metrics": {name: value}}}`` from its node's newest raw frame in ``[at - max_age_s, at]``.

    A node with no frame in that window is absent (it was not reporting then, or its raw
    frames have aged out of retention). ``job_id`` keeps the nodes of one job only.
    """
    if not np.isfinite(at):
        raise ValueError(f"at: must be a finite unix time, got {at!r}")
    if not max_age_s > 0:
        raise ValueError(f"max_age_s: must be > 0, got {max_age_s!r}")
    f, lay = t.sample_frames, t.sample_layouts
    newest = (
        sa.select(f.c.layout, sa.func.max(f.c.ts).label("ts"))
        .where(f.c.ts <= at, f.c.ts >= at - max_age_s)
        .group_by(f.c.layout)
        .subquery()
    )
    q = (
        sa.select(lay.c.node_id, f.c.ts, f.c["values"], lay.c.device_ids, lay.c.metrics)
        .join(newest, sa.and_(f.c.layout == newest.c.layout, f.c.ts == newest.c.ts))
        .join(lay, lay.c.id == f.c.layout)
    )
    if job_id is not None:
        q = q.join(t.nodes, t.nodes.c.node_id == lay.c.node_id).where(t.nodes.c.job_id == job_id)
    per_node: dict[str, tuple] = {}
    with engine.connect() as conn:
        for row in conn.execute(q):
            have = per_node.get(row.node_id)
            if have is None or row.ts > have.ts:  # a node whose layout changed: its newest frame
                per_node[row.node_id] = row
    out: dict[str, dict] = {}
    for node_id, row in per_node.items():
        out.update(frame_device_values(node_id, row.ts, row[2], row))
    return out


def range_end_time(engine: Engine, job_id: str, rng: Range) -> float | None:
    """The time the History page's cluster view shows for ``rng``: the end of a time range
    (just before it, the end is exclusive), else the time of the last stored step of the step
    range (of the job's last step when open-ended); None when there is nothing to show."""
    if rng.end is not None:
        return rng.end - 1e-6
    loads = t.expert_loads
    q = sa.select(sa.func.max(loads.c.ts)).where(loads.c.job_id == job_id)
    if rng.start is not None:
        q = q.where(loads.c.ts >= rng.start)
    if rng.step_start is not None:
        q = q.where(loads.c.step >= rng.step_start)
    if rng.step_end is not None:
        q = q.where(loads.c.step < rng.step_end)
    with engine.connect() as conn:
        ts = conn.execute(q).scalar()
    return None if ts is None else float(ts)
