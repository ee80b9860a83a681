"""Placement plans and their lifecycle, persisted with an event history.

proposed → approved → pushed → applied | failed; also rejected, superseded, rolled_back.
Epochs are per job and strictly increasing: a new plan takes max(epoch) + 1 inside its
transaction and UNIQUE(job_id, epoch) refuses a second writer of the same epoch. Plans made by
a controller carry its leadership term; creating one checks the term is still current, so a
deposed leader cannot create or publish (fencing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.lifecycle import PLANS, check_term
from moeplane.controlplane.store.lifecycle import now as _now
from moeplane.controlplane.store.queries import NotFound
from moeplane.controlplane.store.writes import upsert

# ---------------------------------------------------------------- policy


DEFAULT_POLICY = "*"  # the job_policies row that jobs without their own row follow


def get_policy(engine: Engine, job_id: str) -> RebalancePolicy:
    """A job's policy: its own row, else the cluster default row, else built-in defaults."""
    with engine.connect() as conn:
        if job_id != DEFAULT_POLICY and conn.execute(
            sa.select(t.jobs.c.job_id).where(t.jobs.c.job_id == job_id)
        ).first() is None:
            raise NotFound(f"job {job_id!r}")
        rows = dict(
            (r.job_id, r)
            for r in conn.execute(
                sa.select(t.job_policies).where(t.job_policies.c.job_id.in_([job_id, DEFAULT_POLICY]))
            )
        )
    row = rows.get(job_id) or rows.get(DEFAULT_POLICY)
    if row is None:
        return RebalancePolicy()
    return RebalancePolicy.from_json(row.settings).updated(mode=row.mode)


def set_policy(engine: Engine, job_id: str, changes: dict, clock=None) -> RebalancePolicy:
    """Change some settings of a job's policy (``job_id`` "*": the cluster default)."""
    policy = get_policy(engine, job_id).updated(**changes)
    with engine.begin() as conn:
        upsert(conn, t.job_policies, {"job_id": job_id},
               {"mode": str(policy.mode), "settings": policy.to_json(), "updated_at": _now(clock)})
    return policy


# ---------------------------------------------------------------- plans


def create_plan(
    engine: Engine,
    job_id: str,
    phy2log: np.ndarray,
    *,
    world_size: int,
    slots_per_rank: int,
    status: Status = Status.PROPOSED,
    kind: str = "rebalance",
    base_epoch: int = 0,
    leader_term: int | None = None,
    moves: int = 0,
    cross_node_moves: int = 0,
    predicted_before: float | None = None,
    predicted_after: float | None = None,
    measured_before: float | None = None,
    reason: str = "",
    clock=None,
) -> int:
    """Insert a plan with the next epoch; older open plans become superseded. Returns the epoch.

    phy2log [L, G*S] int64. With ``leader_term``, raises Fenced if the term is stale.
    """
    phy2log = np.ascontiguousarray(phy2log, dtype="<i8")
    if phy2log.ndim != 2 or phy2log.shape[1] != world_size * slots_per_rank:
        raise ValueError(f"phy2log: shape {phy2log.shape} does not match {world_size} x {slots_per_rank} slots")
    for attempt in range(EPOCH_RETRIES):
        try:
            return _insert_plan(
                engine, job_id, phy2log, world_size=world_size, slots_per_rank=slots_per_rank,
                status=status, kind=kind, base_epoch=base_epoch, leader_term=leader_term, moves=moves,
                cross_node_moves=cross_node_moves, predicted_before=predicted_before,
                predicted_after=predicted_after, measured_before=measured_before, reason=reason,
                now=_now(clock),
            )
        except sa.exc.IntegrityError:
            # another writer took this epoch between our read of max(epoch) and our insert;
            # UNIQUE(job_id, epoch) refused the duplicate: read again and take the next one
            if attempt == EPOCH_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


EPOCH_RETRIES = 5


def _insert_plan(engine, job_id, phy2log, *, world_size, slots_per_rank, status, kind, base_epoch,
                 leader_term, moves, cross_node_moves, predicted_before, predicted_after,
                 measured_before, reason, now) -> int:
    with engine.begin() as conn:
        # take the job row's write lock first: plan writers of one job queue here, so the
        # max(epoch) read below is current (PostgreSQL row lock; SQLite's write lock)
        conn.execute(sa.update(t.jobs).where(t.jobs.c.job_id == job_id).values(job_id=t.jobs.c.job_id))
        if leader_term is not None:
            check_term(conn, job_id, leader_term, job_id)
        epoch = 1 + int(
            conn.execute(sa.select(sa.func.coalesce(sa.func.max(t.plans.c.epoch), 0)).where(t.plans.c.job_id == job_id)).scalar()
        )
        PLANS.supersede_open(conn, job_id, sa.true(), by=f"by epoch {epoch}", ts=now)
        conn.execute(
            sa.insert(t.plans).values(
                job_id=job_id, epoch=epoch, status=str(status), kind=kind, base_epoch=base_epoch,
                leader_term=leader_term or 0, created_at=now, updated_at=now, layers=phy2log.shape[0],
                world_size=world_size, slots_per_rank=slots_per_rank, phy2log=phy2log.tobytes(),
                moves=moves, cross_node_moves=cross_node_moves, predicted_before=predicted_before,
                predicted_after=predicted_after, measured_before=measured_before, reason=reason,
            )
        )
        PLANS.event(conn, job_id, epoch, status, now, detail=reason)
    return epoch


def transition(engine: Engine, job_id: str, epoch: int, to: Status, *, detail: str = "",
               node_id: str | None = None, step: int | None = None, clock=None, **values) -> dict:
    """Move a plan to ``to`` (Conflict unless the lifecycle allows it); returns the plan."""
    PLANS.transition(engine, job_id, epoch, to, detail=detail, node_id=node_id, step=step,
                     clock=clock, **values)
    return get_plan(engine, job_id, epoch)


# a plan row without its placement blob (G*S*L*8 bytes: 3.8 MB at 58x8192)
SUMMARY_COLUMNS = tuple(c for c in t.plans.c if c.name != "phy2log")


def _columns(with_placement: bool) -> tuple:
    return tuple(t.plans.c) if with_placement else SUMMARY_COLUMNS


def _plan_dict(row, with_placement: bool) -> dict:
    d = {k: row[k] for k in row if k != "phy2log"}
    if with_placement:
        d["phy2log"] = np.frombuffer(row["phy2log"], dtype="<i8").reshape(row["layers"], -1)
    return d


def get_plan(engine: Engine, job_id: str, epoch: int, *, with_placement: bool = True) -> dict:
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(*_columns(with_placement)).where(t.plans.c.job_id == job_id, t.plans.c.epoch == epoch)
        ).mappings().first()
    if row is None:
        raise NotFound(f"plan {epoch} of job {job_id!r}")
    return _plan_dict(row, with_placement)


def list_plans(engine: Engine, job_id: str, *, status: str | None = None, limit: int = 100) -> list[dict]:
    q = sa.select(*SUMMARY_COLUMNS).where(t.plans.c.job_id == job_id).order_by(t.plans.c.epoch.desc()).limit(limit)
    if status is not None:
        q = q.where(t.plans.c.status == status)
    with engine.connect() as conn:
        return [_plan_dict(r, False) for r in conn.execute(q).mappings().all()]


def plan_events(engine: Engine, job_id: str, epoch: int) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.plan_events).where(t.plan_events.c.job_id == job_id, t.plan_events.c.epoch == epoch)
            .order_by(t.plan_events.c.id)
        ).mappings().all()
    return [dict(r) for r in rows]


def latest_plan(engine: Engine, job_id: str, statuses: tuple[Status, ...], *,
                with_placement: bool = True) -> dict | None:
    """The newest plan of ``job_id`` in one of ``statuses`` (None: none); without its
    ``phy2log`` unless ``with_placement``."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(*_columns(with_placement))
            .where(t.plans.c.job_id == job_id, t.plans.c.status.in_([str(s) for s in statuses]))
            .order_by(t.plans.c.epoch.desc()).limit(1)
        ).mappings().first()
    return None if row is None else _plan_dict(row, with_placement)


REPORT_STATES = ("received", "applied", "failed")


def record_report(
    engine: Engine, job_id: str, epoch: int, node_id: str, state: str, step: int, error: str = "", clock=None
) -> dict:
    """An agent's report on a pushed plan. ``state``: received | applied | failed.

    Raises NotFound for an unknown plan, PermissionError for a node outside the job.
    A plan is applied once every node of the job has reported applied; failed on the first
    failure. The one-report case of ``record_reports``.
    """
    outcome = record_reports(engine, job_id, epoch, [(node_id, state, step, error)], clock)[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _applied_so_far(conn, job_id: str, epoch: int, batch: set[str]) -> tuple[int, set[str]]:
    """Before a batch of reports of plan ``epoch``: how many of the job's nodes have no applied
    report yet, and which nodes of ``batch`` (node ids of the job) have one. Counts in SQL
    instead of reading every node of the job and every earlier applied report per batch."""
    done = sa.select(t.plan_events.c.node_id).where(
        t.plan_events.c.job_id == job_id, t.plan_events.c.epoch == epoch,
        t.plan_events.c.status == "node_applied", t.plan_events.c.node_id.is_not(None),
    )
    missing = conn.execute(
        sa.select(sa.func.count()).select_from(t.nodes).where(
            t.nodes.c.job_id == job_id, t.nodes.c.node_id.not_in(done.scalar_subquery()))
    ).scalar_one()
    before = set(conn.execute(done.where(t.plan_events.c.node_id.in_(batch))).scalars().all()) \
        if batch else set()
    return missing, before


def record_reports(
    engine: Engine, job_id: str, epoch: int, reports: Sequence[tuple[str, str, int, str]], clock=None
) -> list[dict | Exception]:
    """Many agents' reports on one pushed plan, in ONE transaction; an outcome per report.

    ``reports``: (node_id, state, step, error) tuples, in arrival order; ``state`` one of
    received | applied | failed, ``step`` the training step (int), ``error`` free text.
    Returns, in the same order, what ``record_report`` returns for that report (a dict with
    ``status``, and ``waiting_for`` while nodes are missing) or the exception it would raise:
    NotFound (unknown plan: every report), PermissionError (node outside the job),
    ValueError (unknown state). A bad report fails only itself; its event is not stored.

    The outcome is what applying the reports one by one in this order gives: the plan fails
    at the first failed report while it is pushed; it is applied at the report that completes
    the set of the job's nodes with an applied report (earlier reports included). The plan row
    is locked once, membership is one query, the events go in one executemany.
    """
    now = _now(clock)
    with engine.begin() as conn:
        plan = conn.execute(
            sa.select(t.plans.c.status, t.plans.c.kind, t.plans.c.base_epoch)
            .where(t.plans.c.job_id == job_id, t.plans.c.epoch == epoch).with_for_update()
        ).first()
        if plan is None:
            return [NotFound(f"plan {epoch} of job {job_id!r}") for _ in reports]
        asked = {r[0] for r in reports}
        member = set(conn.execute(
            sa.select(t.nodes.c.node_id).where(t.nodes.c.node_id.in_(asked), t.nodes.c.job_id == job_id)
        ).scalars().all()) if asked else set()
        outcomes: list[dict | Exception] = []
        events: list[dict] = []  # plan_events rows in the order one-by-one reports would write them
        status = plan.status
        # read on the first applied report of a pushed plan: how many of the job's nodes have
        # no applied report yet, and which of this batch's nodes had one before the batch
        missing: int | None = None
        applied: set[str] = set()
        applied_step = None

        def event(status_, *, node_id=None, step=None, detail="", of_epoch=epoch):
            events.append({"job_id": job_id, "epoch": of_epoch, "ts": now, "status": str(status_),
                           "node_id": node_id, "step": step, "detail": detail})

        for node_id, state, step, error in reports:
            if state not in REPORT_STATES:
                outcomes.append(ValueError(
                    f"plan report of node {node_id!r}: state {state!r} is not one of {', '.join(REPORT_STATES)}"))
                continue
            if node_id not in member:
                outcomes.append(PermissionError(f"node {node_id!r} is not part of job {job_id!r}"))
                continue
            event(f"node_{state}", node_id=node_id, step=step, detail=error)
            if status != str(Status.PUSHED):
                outcomes.append({"status": status})
            elif state == "failed":
                status = str(Status.FAILED)
                event(Status.FAILED, node_id=node_id, step=step, detail=error)
                outcomes.append({"status": status})
            elif state != "applied":
                outcomes.append({"status": status})
            else:
                if missing is None:
                    missing, applied = _applied_so_far(conn, job_id, epoch, {
                        r[0] for r in reports if r[1] == "applied" and r[0] in member})
                if node_id not in applied:
                    applied.add(node_id)
                    missing -= 1
                if missing > 0:
                    outcomes.append({"status": status, "waiting_for": missing})
                else:
                    status, applied_step = str(Status.APPLIED), step
                    event(Status.APPLIED, step=step)
                    outcomes.append({"status": status})
        if status == str(Status.APPLIED) and applied_step is not None:
            # the placement it replaced is no longer running
            prev = conn.execute(
                sa.select(t.plans.c.epoch).where(
                    t.plans.c.job_id == job_id, t.plans.c.epoch < epoch,
                    t.plans.c.status == str(Status.APPLIED),
                )
            ).scalars().all()
            rolled = [old for old in prev if plan.kind == "rollback" and old > plan.base_epoch]
            if rolled:
                conn.execute(
                    sa.update(t.plans).where(t.plans.c.job_id == job_id, t.plans.c.epoch.in_(rolled))
                    .values(status=str(Status.ROLLED_BACK), updated_at=now)
                )
            for old in rolled:
                event(Status.ROLLED_BACK, detail=f"rolled back by epoch {epoch}", of_epoch=old)
        if status != plan.status:
            values = {"status": status, "updated_at": now}
            if status == str(Status.APPLIED):
                values["applied_step"] = applied_step
            conn.execute(
                sa.update(t.plans).where(t.plans.c.job_id == job_id, t.plans.c.epoch == epoch).values(**values)
            )
        if events:
            conn.execute(sa.insert(t.plan_events), events)
    return outcomes
