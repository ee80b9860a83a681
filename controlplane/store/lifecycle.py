"""What the two decision lifecycles (placement plans, offload decisions) share: the clock
default and the leadership fence checked inside the transaction that creates a decision."""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from moeplane.controlplane.store import tables as t


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
