"""The one store of the decision lifecycle, parameterised by table: status changes, their
event history, superseding open decisions, the clock default and the leadership fence.

Plans (:mod:`.plans`, keyed by (job_id, epoch)) and offload decisions (:mod:`.offload`, keyed
by decision_id) each describe their tables with a :class:`Lifecycle`; legal transitions come
from :mod:`moeplane.controlplane.domain.lifecycle`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.domain.lifecycle import ALLOWED_FROM, Status, check_transition
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.queries import NotFound


class Fenced(Exception):
    """The caller's leadership term is no longer current; it must not create or publish."""


def now(clock: Callable[[], float] | None) -> float:
    """Unix seconds from ``clock``, or the wall clock when none is injected."""
    return (clock or time.time)()


def check_term(conn: Connection, lease: str, leader_term: int, job_id: str) -> None:
    """Raise Fenced unless ``leader_term`` is the current term of ``lease`` (row locked for the
    rest of the transaction, so a takeover waits until this decision is written)."""
    term = conn.execute(
        sa.select(t.job_leases.c.term).where(t.job_leases.c.job_id == lease).with_for_update()
    ).scalar()
    if term != leader_term:
        raise Fenced(f"job {job_id!r}: leadership term {leader_term} is stale (current {term})")


@dataclass(frozen=True)
class Lifecycle:
    """A decision table and its event table: rows keyed by (job_id, ``key``)."""

    rows: sa.Table
    events: sa.Table
    key: str  # "epoch" | "decision_id"
    noun: str  # "plan" | "offload decision", for messages

    def what(self, job_id: str, key: int) -> str:
        return f"{self.noun} {key} of job {job_id!r}"

    def where(self, job_id: str, key: int):
        return sa.and_(self.rows.c.job_id == job_id, self.rows.c[self.key] == key)

    def event(self, conn: Connection, job_id: str, key: int, status: str, ts: float, *,
              node_id: str | None = None, step: int | None = None, detail: str = "") -> None:
        conn.execute(sa.insert(self.events).values(
            job_id=job_id, ts=ts, status=str(status), node_id=node_id, step=step, detail=detail,
            **{self.key: key}))

    def transition(self, engine: Engine, job_id: str, key: int, to: Status, *, detail: str = "",
                   node_id: str | None = None, step: int | None = None, clock=None,
                   **values) -> None:
        """Move one decision to ``to`` (Conflict if its state does not allow it; NotFound if
        there is none) and record the event, in one transaction. ``values``: other columns."""
        ts = now(clock)
        with engine.begin() as conn:
            row = conn.execute(
                sa.select(self.rows.c.status).where(self.where(job_id, key)).with_for_update()
            ).first()
            if row is None:
                raise NotFound(self.what(job_id, key))
            check_transition(row.status, to, self.what(job_id, key))
            conn.execute(sa.update(self.rows).where(self.where(job_id, key))
                         .values(status=str(to), updated_at=ts, **values))
            self.event(conn, job_id, key, to, ts, node_id=node_id, step=step, detail=detail)

    def supersede_open(self, conn: Connection, job_id: str, scope, *, by: str, ts: float) -> None:
        """Inside the transaction that creates a decision: every open decision of ``job_id``
        matching ``scope`` (a SQL condition) becomes superseded, with the event ``by``."""
        stale = conn.execute(
            sa.select(self.rows.c[self.key]).where(
                self.rows.c.job_id == job_id, scope,
                self.rows.c.status.in_([str(s) for s in ALLOWED_FROM[Status.SUPERSEDED]]))
        ).scalars().all()
        for old in stale:
            conn.execute(sa.update(self.rows).where(self.where(job_id, old))
                         .values(status=str(Status.SUPERSEDED), updated_at=ts))
            self.event(conn, job_id, old, Status.SUPERSEDED, ts, detail=by)


PLANS = Lifecycle(t.plans, t.plan_events, "epoch", "plan")
OFFLOAD = Lifecycle(t.offload_decisions, t.offload_events, "decision_id", "offload decision")
