"""Per-step phase seconds of RL jobs (table ``rl_step_phases``, migration 0009): written with the
spans, read for long timelines.

:func:`add` runs in the spans' transaction with the spans that transaction actually inserted
(a resent span adds nothing); it reads the (job, step, node) rows the spans touch, adds to them
and writes them back. On PostgreSQL a transaction-scoped advisory lock on (job, node) keeps two
reports of one node from both reading the old row; SQLite's single writer (the spans' insert
already holds the write lock) does the same. :func:`read` decodes a range's rows with one
``numpy.frombuffer`` per phase width.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl.phases import PHASES

_UPSERT = ("INSERT INTO rl_step_phases (job_id, step, node_id, phases, ranks, data) VALUES ({0}, {0}, {0}, {0}, {0}, {0}) "
           "ON CONFLICT (job_id, step, node_id) DO UPDATE SET phases = excluded.phases, ranks = excluded.ranks, "
           "data = excluded.data")


def add(conn: Connection, job_id: str, node_id: str, step, rank, role, phase, start, end) -> None:
    """Add N newly stored spans of ``node_id`` (step, rank, role, phase int [N]; start, end
    float64 [N], unix s) to their steps' rows. Plain driver SQL: this runs once per report."""
    steps, records = sp.summarize(step, rank, role, phase, start, end)
    if steps.size == 0:
        return
    raw = conn.connection.driver_connection
    distinct = np.unique(steps).tolist()
    if conn.dialect.name == "postgresql":
        raw.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"rl_step_phases/{job_id}/{node_id}",))
        with raw.cursor(binary=True) as cur:
            rows = cur.execute("SELECT step, phases, data FROM rl_step_phases WHERE job_id = %s AND node_id = %s "
                               "AND step = ANY(%s)", (job_id, node_id, distinct)).fetchall()
        mark = "%s"
    else:
        rows = []
        for i in range(0, len(distinct), 500):
            part = distinct[i:i + 500]
            rows += raw.execute("SELECT step, phases, data FROM rl_step_phases WHERE job_id = ? AND node_id = ? "
                                f"AND step IN ({', '.join('?' * len(part))})", (job_id, node_id, *part)).fetchall()
        mark = "?"
    old = {int(s): np.frombuffer(bytes(d), dtype=sp.record_dtype(p)) for s, p, d in rows}
    cut = np.flatnonzero(np.diff(steps)) + 1
    out = []
    for s, rec in zip(np.split(steps, cut), np.split(records, cut), strict=True):
        key = int(s[0])
        merged = sp.merge(old[key], rec) if key in old else rec
        out.append((job_id, key, node_id, merged.dtype["seconds"].shape[0], merged.size, merged.tobytes()))
    cur = raw.cursor()
    cur.executemany(_UPSERT.format(mark), out)
    cur.close()


def read(engine: Engine, job_id: str, step_start: int, step_end: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps int64 [K], records [K] of ``record_dtype(len(PHASES))``): every (step, rank)
    record of the job's steps [step_start, step_end), in (step, node) order. PostgreSQL sends
    the rows in binary (bytea as hex text would cost about 4x the time)."""
    sql = "SELECT step, phases, ranks, data FROM rl_step_phases WHERE job_id = {0} AND step >= {0} AND step < {0} " \
          "ORDER BY step, node_id"
    args = (job_id, int(step_start), int(step_end))
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        if engine.dialect.name == "postgresql":
            with raw.cursor(binary=True) as cur:
                rows = cur.execute(sql.format("%s"), args).fetchall()
        else:
            rows = raw.execute(sql.format("?"), args).fetchall()
    steps, parts = [], []
    for p in sorted({int(r[1]) for r in rows}):
        mine = [r for r in rows if r[1] == p]
        records = np.frombuffer(b"".join(bytes(r[3]) for r in mine), dtype=sp.record_dtype(p))
        parts.append(sp.widen(records, len(PHASES)))
        steps.append(np.repeat(np.array([r[0] for r in mine], dtype=np.int64), [r[2] for r in mine]))
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=sp.record_dtype())
    if len(parts) == 1:
        return steps[0], parts[0]
    order = np.argsort(np.concatenate(steps), kind="stable")  # rows of two phase widths: back to step order
    return np.concatenate(steps)[order], np.concatenate(parts)[order]
