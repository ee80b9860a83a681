"""What a node owns: a job's spec is set once, a device belongs to the node that first
declared it, and a job's rank to the node that first announced it.

Checked inside the hello's transaction (``StoreWriter.register_hello``). A node whose hello
would change any of these gets :class:`SpecConflict` (a spec that differs from the job's) or
:class:`Claimed` (a device or rank of another node); the transaction then writes nothing.
An operator frees a node's devices and ranks with :func:`release_node` (REST
``DELETE /api/v1/nodes/{node_id}/claims``): the next node to declare them owns them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.store import bulk
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.queries import NotFound

SPEC_FIELDS = ("layers", "experts", "top_k", "world_size", "slots_per_rank", "ranks_per_node",
               "groups")


class SpecConflict(ValueError):
    """A job spec that differs from the one the job already has. ``field`` names the first
    differing field (``hello.job.<name>``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Claimed(PermissionError):
    """A device or rank that belongs to another node."""


def parse_ranks(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def fix_job_spec(conn: Connection, job_id: str, spec: dict[str, int], ts: float) -> None:
    """Create ``job_id`` with ``spec`` (its non-zero SPEC_FIELDS), or check ``spec`` against the
    stored one: a field already set must be equal (else SpecConflict, nothing written); a field
    not set yet is filled in. No row lock: 1,024 agents reconnecting declare the same spec."""
    cols = ("job_id", "created_at", *SPEC_FIELDS)
    bulk.run_compiled(
        conn, "job-spec-if-new",
        lambda c: bulk.dialect_insert(c, t.jobs).values({k: sa.bindparam(k) for k in cols})
        .on_conflict_do_nothing(index_elements=[t.jobs.c.job_id]),
        {"job_id": job_id, "created_at": ts} | {k: spec.get(k) for k in SPEC_FIELDS},
    )
    if not spec:
        return
    row = conn.execute(sa.select(*(t.jobs.c[k] for k in SPEC_FIELDS)).where(t.jobs.c.job_id == job_id)).one()
    for k, v in spec.items():
        have = getattr(row, k)
        if have is not None and have != v:
            raise SpecConflict(f"hello.job.{k}", f"job {job_id!r} has {k}={have}, this spec says {v} "
                                                 "(a job's spec is set once; an operator changes it through REST)")
    missing = {k: v for k, v in spec.items() if getattr(row, k) is None}
    if missing:
        conn.execute(sa.update(t.jobs).where(t.jobs.c.job_id == job_id)
                     .values({k: sa.func.coalesce(t.jobs.c[k], v) for k, v in missing.items()}))


def check_devices(conn: Connection, node_id: str, device_ids: Sequence[str]) -> None:
    """Claimed when any of ``device_ids`` is registered to another node."""
    if not device_ids:
        return
    taken = conn.execute(
        sa.select(t.devices.c.device_id, t.devices.c.node_id)
        .where(t.devices.c.device_id.in_(list(device_ids)), t.devices.c.node_id != node_id)
        .order_by(t.devices.c.device_id).limit(1)
    ).first()
    if taken is not None:
        raise Claimed(f"device {taken.device_id!r} belongs to node {taken.node_id!r} "
                      "(an operator frees it: DELETE /api/v1/nodes/{node}/claims)")


def check_ranks(conn: Connection, job_id: str, node_id: str, ranks: Sequence[int]) -> None:
    """Claimed when another node of ``job_id`` announced any of ``ranks``.

    A node announcing what it already holds (a reconnect) costs one primary-key read; a new
    announcement is matched in SQL against the job's other nodes (``nodes.ranks`` text)."""
    if not ranks:
        return
    mine = conn.execute(
        sa.select(t.nodes.c.job_id, t.nodes.c.ranks).where(t.nodes.c.node_id == node_id)
    ).first()
    if mine is not None and mine.job_id == job_id and set(parse_ranks(mine.ranks)) >= set(ranks):
        return
    wrapped = sa.literal(",") + t.nodes.c.ranks + sa.literal(",")
    clash = conn.execute(
        sa.select(t.nodes.c.node_id, t.nodes.c.ranks)
        .where(t.nodes.c.job_id == job_id, t.nodes.c.node_id != node_id,
               sa.or_(*(wrapped.like(f"%,{int(r)},%") for r in sorted(set(ranks)))))
        .order_by(t.nodes.c.node_id).limit(1)
    ).first()
    if clash is not None:
        both = sorted(set(parse_ranks(clash.ranks)) & set(ranks))
        raise Claimed(f"rank(s) {both} of job {job_id!r} belong to node {clash.node_id!r} "
                      "(an operator frees them: DELETE /api/v1/nodes/{node}/claims)")


def release_node(engine: Engine, node_id: str) -> dict:
    """Free ``node_id``'s ranks (it leaves its job) and devices. Returns what was freed:
    ``{"node_id", "job_id", "ranks": [...], "devices": [...]}``; NotFound for an unknown node."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(t.nodes.c.job_id, t.nodes.c.ranks).where(t.nodes.c.node_id == node_id)
        ).first()
        if row is None:
            raise NotFound(f"node {node_id!r}")
        devices = conn.execute(
            sa.select(t.devices.c.device_id).where(t.devices.c.node_id == node_id).order_by(t.devices.c.device_id)
        ).scalars().all()
        conn.execute(sa.delete(t.devices).where(t.devices.c.node_id == node_id))
        conn.execute(sa.update(t.nodes).where(t.nodes.c.node_id == node_id).values(job_id=None, ranks=""))
    return {"node_id": node_id, "job_id": row.job_id, "ranks": list(parse_ranks(row.ranks)),
            "devices": list(devices)}
