"""One controller per job across replicas.

PostgreSQL: a session-level advisory lock per job, held on a dedicated connection; when the
holder's process dies its connection closes and the lock frees, so another replica takes over
on its next attempt. Each acquisition bumps the job's term in ``job_leases``; plans carry the
term and creating one checks it (see store.plans.create_plan), which fences a deposed leader.
SQLite (one embedded process): this process is always the leader, with a term per start.
"""

from __future__ import annotations

import hashlib
import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.writes import upsert


def lock_key(job_id: str) -> int:
    """Stable signed 64-bit advisory-lock key of a job."""
    return int.from_bytes(hashlib.sha256(f"moeplane:{job_id}".encode()).digest()[:8], "big", signed=True)


class Leadership:
    """Tracks which jobs this replica leads. Not thread-safe: one controller task uses it."""

    def __init__(self, engine: Engine, holder: str, clock=time.time):
        self.engine = engine
        self.holder = holder
        self.clock = clock
        self.terms: dict[str, int] = {}
        self._conns: dict[str, Connection] = {}
        self.postgres = engine.dialect.name == "postgresql"

    def try_lead(self, job_id: str) -> int | None:
        """The term if this replica leads ``job_id`` (acquiring it when free), else None."""
        if job_id in self.terms:
            if self.postgres and not self._still_connected(job_id):
                self.release(job_id)
                return None
            return self.terms[job_id]
        if self.postgres:
            conn = self.engine.connect()
            got = conn.execute(sa.select(sa.func.pg_try_advisory_lock(lock_key(job_id)))).scalar()
            conn.commit()
            if not got:
                conn.close()
                return None
            self._conns[job_id] = conn
        self.terms[job_id] = self._bump_term(job_id)
        return self.terms[job_id]

    def _still_connected(self, job_id: str) -> bool:
        try:
            self._conns[job_id].execute(sa.text("SELECT 1"))
            self._conns[job_id].commit()
            return True
        except sa.exc.DBAPIError:
            return False

    def _bump_term(self, job_id: str) -> int:
        with self.engine.begin() as conn:
            term = conn.execute(
                sa.select(t.job_leases.c.term).where(t.job_leases.c.job_id == job_id).with_for_update()
            ).scalar()
            new = (term or 0) + 1
            upsert(conn, t.job_leases, {"job_id": job_id},
                   {"term": new, "holder": self.holder, "acquired_at": self.clock()})
        return new

    def release(self, job_id: str) -> None:
        self.terms.pop(job_id, None)
        conn = self._conns.pop(job_id, None)
        if conn is not None:
            try:
                conn.execute(sa.select(sa.func.pg_advisory_unlock(lock_key(job_id))))
                conn.commit()
            except sa.exc.DBAPIError:
                pass
            conn.close()

    def release_all(self) -> None:
        for job_id in list(self.terms):
            self.release(job_id)
