"""Memory offload in the store: offload policy, decisions and their lifecycle.

Decision lifecycle (one device each): proposed → approved → pushed → applied | failed; also
rejected (by an operator), superseded (a newer decision for the device came first) and
advisory (nothing to push: "cannot meet the watermark", or a larger micro-batch suggested;
shown, never applied). decision_id is global and increasing. Decisions made by a controller
carry its leadership term; creating one checks the term is still current (fencing). The
agent's report of an applied decision records the measured device peak and the bytes saved
beside the predicted peak.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.domain.offload_policy import OffloadPolicy
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.lifecycle import OFFLOAD, check_term
from moeplane.controlplane.store.lifecycle import now as _now
from moeplane.controlplane.store.queries import NotFound
from moeplane.controlplane.store.writes import upsert


def _require_job(conn: Connection, job_id: str) -> None:
    if conn.execute(sa.select(t.jobs.c.job_id).where(t.jobs.c.job_id == job_id)).first() is None:
        raise NotFound(f"job {job_id!r}")


# ---------------------------------------------------------------- policy


def get_policy(engine: Engine, job_id: str) -> OffloadPolicy:
    with engine.connect() as conn:
        _require_job(conn, job_id)
        row = conn.execute(
            sa.select(t.offload_policies).where(t.offload_policies.c.job_id == job_id)
        ).mappings().first()
    if row is None:
        return OffloadPolicy()
    return OffloadPolicy(mode=row["mode"], high_watermark=row["high_watermark"],
                         low_watermark=row["low_watermark"], decision_timeout_s=row["decision_timeout_s"])


def set_policy(engine: Engine, job_id: str, changes: dict, clock=None) -> OffloadPolicy:
    """Apply ``changes`` (a subset of OffloadPolicy's fields); ValueError names a bad one."""
    policy = get_policy(engine, job_id).updated(**changes)
    with engine.begin() as conn:
        upsert(conn, t.offload_policies, {"job_id": job_id}, policy.to_dict() | {"updated_at": _now(clock)})
    return policy


# ---------------------------------------------------------------- decisions


def create_decision(
    engine: Engine,
    job_id: str,
    *,
    device_id: str,
    node_id: str,
    rank: int,
    verdict: str,
    actions: list[dict],
    undo: list[dict],
    reason: str,
    profile_step: int,
    capacity_bytes: int,
    used_bytes: int,
    peak_now_bytes: int,
    predicted_peak_bytes: int,
    high_watermark_bytes: int,
    low_watermark_bytes: int,
    host_bytes: int,
    overhead_s: float,
    status: Status = Status.PROPOSED,
    leader_term: int | None = None,
    lease: str | None = None,
    clock=None,
) -> int:
    """Insert a decision; open (proposed/approved) decisions of the device become superseded.

    ``actions``: dicts with kind, layers, bytes_saved, host_bytes, overhead_s, prefetch (the
    complete set to have in effect); ``undo``: dicts with kind, layer. With ``leader_term``
    (checked against the lease row ``lease``, default the job id), raises Fenced if stale.
    Returns the decision_id.
    """
    now = _now(clock)
    signature = signature_of(verdict, actions)
    with engine.begin() as conn:
        if leader_term is not None:
            check_term(conn, lease or job_id, leader_term, job_id)
        decision_id = conn.execute(
            sa.insert(t.offload_decisions).values(
                job_id=job_id, device_id=device_id, node_id=node_id, rank=rank, status=str(status),
                verdict=verdict, signature=signature, actions=json.dumps(actions), undo=json.dumps(undo),
                reason=reason, leader_term=leader_term or 0, profile_step=profile_step,
                created_at=now, updated_at=now, capacity_bytes=capacity_bytes, used_bytes=used_bytes,
                peak_now_bytes=peak_now_bytes, predicted_peak_bytes=predicted_peak_bytes,
                high_watermark_bytes=high_watermark_bytes, low_watermark_bytes=low_watermark_bytes,
                host_bytes=host_bytes, overhead_s=overhead_s,
            )
        ).inserted_primary_key[0]
        OFFLOAD.supersede_open(
            conn, job_id, sa.and_(t.offload_decisions.c.device_id == device_id,
                                  t.offload_decisions.c.decision_id != decision_id),
            by=f"by decision {decision_id}", ts=now)
        OFFLOAD.event(conn, job_id, decision_id, status, now, step=profile_step, detail=reason)
    return int(decision_id)


def signature_of(verdict: str, actions: list[dict]) -> str:
    """Verdict and action set, order-free: two decisions with one signature ask the same."""
    pairs = sorted(f"{a['kind']}:{layer}" for a in actions for layer in a["layers"])
    return f"{verdict}|{','.join(pairs)}"


def _decision_dict(row) -> dict:
    d = dict(row)
    d["actions"] = json.loads(d["actions"])
    d["undo"] = json.loads(d["undo"])
    return d


def _select(job_id: str, decision_id: int):
    return sa.select(t.offload_decisions).where(
        t.offload_decisions.c.job_id == job_id, t.offload_decisions.c.decision_id == decision_id
    )


def get_decision(engine: Engine, job_id: str, decision_id: int) -> dict:
    with engine.connect() as conn:
        row = conn.execute(_select(job_id, decision_id)).mappings().first()
    if row is None:
        raise NotFound(f"offload decision {decision_id} of job {job_id!r}")
    return _decision_dict(row)


def list_decisions(engine: Engine, job_id: str, *, device_id: str | None = None,
                   status: str | None = None, limit: int = 100) -> list[dict]:
    """Newest first."""
    q = sa.select(t.offload_decisions).where(t.offload_decisions.c.job_id == job_id)
    if device_id is not None:
        q = q.where(t.offload_decisions.c.device_id == device_id)
    if status is not None:
        q = q.where(t.offload_decisions.c.status == str(status))
    q = q.order_by(t.offload_decisions.c.decision_id.desc()).limit(limit)
    with engine.connect() as conn:
        return [_decision_dict(r) for r in conn.execute(q).mappings().all()]


def latest_per_device(engine: Engine, job_id: str) -> dict[str, dict]:
    """device_id -> its newest decision (any status)."""
    newest = (
        sa.select(sa.func.max(t.offload_decisions.c.decision_id))
        .where(t.offload_decisions.c.job_id == job_id)
        .group_by(t.offload_decisions.c.device_id)
    )
    q = sa.select(t.offload_decisions).where(t.offload_decisions.c.decision_id.in_(newest))
    with engine.connect() as conn:
        return {r["device_id"]: _decision_dict(r) for r in conn.execute(q).mappings().all()}


def decision_events(engine: Engine, decision_id: int) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.offload_events.c.ts, t.offload_events.c.status, t.offload_events.c.node_id,
                      t.offload_events.c.step, t.offload_events.c.detail)
            .where(t.offload_events.c.decision_id == decision_id).order_by(t.offload_events.c.id)
        ).mappings().all()
    return [dict(r) for r in rows]


def transition(engine: Engine, job_id: str, decision_id: int, to: Status, *, detail: str = "",
               node_id: str | None = None, step: int | None = None, clock=None, **values) -> dict:
    """Move a decision to ``to`` (Conflict unless the lifecycle allows it); returns it."""
    OFFLOAD.transition(engine, job_id, decision_id, to, detail=detail, node_id=node_id, step=step,
                       clock=clock, **values)
    return get_decision(engine, job_id, decision_id)


def record_report(
    engine: Engine,
    decision_id: int,
    *,
    job_id: str,
    device_id: str,
    node_id: str,
    state: str,
    step: int,
    measured_used_bytes: int,
    measured_saved_bytes: int,
    error: str = "",
    clock=None,
) -> dict:
    """An agent's report on a pushed decision. ``state``: received | applied | failed.

    Raises NotFound for an unknown decision (or one of another job), ValueError naming the
    field for a report that does not match the decision, PermissionError for a node other
    than the decision's. A report on a decision no longer pushed is recorded as an event only.
    """
    now = _now(clock)
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(t.offload_decisions.c.status, t.offload_decisions.c.device_id,
                      t.offload_decisions.c.node_id, t.offload_decisions.c.capacity_bytes)
            .where(t.offload_decisions.c.job_id == job_id, t.offload_decisions.c.decision_id == decision_id)
            .with_for_update()
        ).first()
        if row is None:
            raise NotFound(f"offload decision {decision_id} of job {job_id!r}")
        if row.node_id != node_id:
            raise PermissionError(f"offload decision {decision_id} is for node {row.node_id!r}, not {node_id!r}")
        if row.device_id != device_id:
            raise ValueError(f"device_id: offload decision {decision_id} is for device {row.device_id!r}, "
                             f"not {device_id!r}")
        if state == "applied" and measured_used_bytes > row.capacity_bytes:
            raise ValueError(f"measured_used_bytes: {measured_used_bytes} is more than the device's "
                             f"capacity {row.capacity_bytes}")
        detail = error or (f"used {measured_used_bytes} B, saved {measured_saved_bytes} B" if state == "applied" else "")
        OFFLOAD.event(conn, job_id, decision_id, f"node_{state}", now, node_id=node_id, step=step, detail=detail)
        if row.status != str(Status.PUSHED) or state == "received":
            return {"status": row.status}
        if state == "failed":
            values = {"status": str(Status.FAILED), "error": error, "updated_at": now}
        else:
            values = {"status": str(Status.APPLIED), "applied_step": step, "updated_at": now,
                      "measured_used_bytes": measured_used_bytes, "measured_saved_bytes": measured_saved_bytes}
        conn.execute(sa.update(t.offload_decisions).where(t.offload_decisions.c.decision_id == decision_id)
                     .values(**values))
        OFFLOAD.event(conn, job_id, decision_id, values["status"], now, node_id=node_id, step=step, detail=error)
        return {"status": values["status"]}
