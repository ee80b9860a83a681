"""Column reads of RL phase spans for large timelines: only rank, role, phase, start and end,
straight into numpy.

PostgreSQL: ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``, whose rows of fixed-width,
non-null columns are parsed with one ``numpy.frombuffer``; SQLite: one ``fetchall`` of plain
tuples. The ``ix_rl_spans_job_step`` index (job_id, step) finds the rows (PostgreSQL scans the
table instead when the range holds most of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine

_SQL = ("SELECT rank, role, phase, start_ts, end_ts FROM rl_spans "
        "WHERE job_id = {job} AND step >= {lo} AND step < {hi}")
# one COPY binary row: field count, then (length, value) per column, big-endian
_PG_ROW = np.dtype([("n", ">i2"), ("l0", ">i4"), ("rank", ">i4"), ("l1", ">i4"), ("role", ">i2"),
                    ("l2", ">i4"), ("phase", ">i2"), ("l3", ">i4"), ("start", ">f8"), ("l4", ">i4"),
                    ("end", ">f8")])
_PG_HEADER = 19  # signature (11), flags (4), header extension length (4)


@dataclass(frozen=True)
class TimelineColumns:
    """N spans on D devices. ranks int32 [D] (distinct, ascending; -1: the job's per-step
    timers); roles int8 [D] (each rank's role, the highest code seen); device int64 [N] (index
    into ranks); phase int8 [N] (code into PHASES); start, end float64 [N] (unix s)."""

    ranks: np.ndarray
    roles: np.ndarray
    device: np.ndarray
    phase: np.ndarray
    start: np.ndarray
    end: np.ndarray


def read_timeline_columns(engine: Engine, job_id: str, step_start: int, step_end: int) -> TimelineColumns:
    """The job's spans of steps [step_start, step_end), unordered."""
    if engine.dialect.name == "postgresql":
        rank, role, phase, start, end = _read_pg(engine, job_id, step_start, step_end)
    else:
        with engine.connect() as conn:  # plain tuples from the driver: Row objects convert slowly
            rows = conn.connection.driver_connection.execute(
                _SQL.format(job="?", lo="?", hi="?"), (job_id, int(step_start), int(step_end))).fetchall()
        a = np.array(rows, dtype=np.float64).reshape(len(rows), 5)
        rank, role, phase, start, end = (a[:, 0].astype(np.int32), a[:, 1].astype(np.int8),
                                         a[:, 2].astype(np.int8), a[:, 3], a[:, 4])
    ranks, device = np.unique(rank, return_inverse=True)
    roles = np.full(ranks.size, -1, dtype=np.int8)
    np.maximum.at(roles, device, role)
    return TimelineColumns(ranks.astype(np.int32), roles, device.astype(np.int64).reshape(-1), phase, start, end)


def _read_pg(engine: Engine, job_id: str, step_start: int, step_end: int):
    sql = f"COPY ({_SQL.format(job='%s', lo='%s', hi='%s')}) TO STDOUT (FORMAT binary)"
    buf = bytearray()
    with (engine.connect() as conn, conn.connection.driver_connection.cursor() as cur,
          cur.copy(sql, (job_id, int(step_start), int(step_end))) as copy):
        for chunk in copy:  # one row per chunk
            buf += chunk
    rows = np.frombuffer(buf, dtype=_PG_ROW, offset=_PG_HEADER, count=(len(buf) - _PG_HEADER - 2) // _PG_ROW.itemsize)
    return (rows["rank"].astype(np.int32), rows["role"].astype(np.int8), rows["phase"].astype(np.int8),
            rows["start"].astype(np.float64), rows["end"].astype(np.float64))

