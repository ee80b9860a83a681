"""RL post-training rows: phase spans, weight syncs, consumed batches and phase loads.

Writes are idempotent by each table's primary key (a resent report stores nothing twice):
spans by (job, node, rank, phase, start), syncs by (job, rank, to_version), batches by
(job, step, rank), phase loads by (job, rank, step, phase) (:mod:`.rl_loads`). One
transaction per report, which also adds the spans it inserted to their steps' phase seconds
(:mod:`.rl_steps`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from moeplane.controlplane.rl.phases import Spans
from moeplane.controlplane.store import bulk, rl_loads, rl_steps
from moeplane.controlplane.store import rl_tables as rt
from moeplane.controlplane.store import tables as t

SPAN_COLUMNS = ("job_id", "node_id", "rank", "phase", "start_ts", "end_ts", "step", "version", "role", "tokens")
SPAN_KEY = ("job_id", "node_id", "rank", "phase", "start_ts")
SYNC_COLUMNS = ("job_id", "rank", "to_version", "from_version", "node_id", "step", "bytes", "start_ts",
                "pause_s", "transfer_s", "resume_s")
BATCH_COLUMNS = ("job_id", "step", "rank", "node_id", "trained_version", "samples", "lag_min", "lag_mean",
                 "lag_max", "bound", "dropped", "partial", "ts")
MAX_SPANS = 2_000_000  # most spans one read returns


def save_report(engine: Engine, job_id: str, node_id: str, spans: Spans,
                syncs: Sequence[dict] = (), batches: Sequence[dict] = (),
                phase_loads: Sequence[rl_loads.PhaseLoadsRow] = ()) -> None:
    """Store a report's spans, weight syncs (dicts of SYNC_COLUMNS but job and node), batches
    (dicts of BATCH_COLUMNS but job and node) and phase loads in one transaction; existing
    keys are kept as they are."""
    with engine.begin() as conn:
        rl_loads.insert(conn, job_id, node_id, phase_loads)
        _insert_spans(conn, job_id, node_id, spans)
        bulk.insert(conn, rt.rl_weight_syncs, SYNC_COLUMNS,
                    [_row(SYNC_COLUMNS, s, job_id, node_id) for s in syncs],
                    ignore_conflicts_on=("job_id", "rank", "to_version"))
        bulk.insert(conn, rt.rl_batches, BATCH_COLUMNS,
                    [_row(BATCH_COLUMNS, b, job_id, node_id) for b in batches],
                    ignore_conflicts_on=("job_id", "step", "rank"))


def _insert_spans(conn: Connection, job_id: str, node_id: str, spans: Spans) -> None:
    """INSERT ... ON CONFLICT (SPAN_KEY) DO NOTHING of every span, then the spans inserted
    (RETURNING: a resent one is not) added to their steps' phase seconds (:mod:`.rl_steps`).

    PostgreSQL: one ``unnest`` of array literals built from the columns (``repr`` of a float is
    exact), sent as text: psycopg's per-item binary dumping of Python lists cost several times
    more per span. SQLite: multi-row VALUES statements of plain parameters (executemany cannot
    return rows)."""
    n = len(spans)
    if n == 0:
        return
    cols = ("rank", "phase", "start_ts", "end_ts", "step", "version", "role", "tokens")
    values = (spans.rank, spans.phase, spans.start, spans.end, spans.step, spans.version, spans.role, spans.tokens)
    names = ", ".join(f'"{c}"' for c in ("job_id", "node_id", *cols))
    tail = f"ON CONFLICT ({', '.join(SPAN_KEY)}) DO NOTHING RETURNING step, rank, role, phase, start_ts, end_ts"
    if conn.dialect.name == "postgresql":
        types = ("int", "smallint", "float8", "float8", "bigint", "bigint", "smallint", "bigint")
        arrays = ", ".join(f"%s::{ty}[]" for ty in types)
        sql = f"INSERT INTO rl_spans ({names}) SELECT %s, %s, * FROM unnest({arrays}) {tail}"
        literals = ["{" + ",".join(map(repr, v.tolist())) + "}" for v in values]
        rows = conn.connection.driver_connection.execute(sql, [job_id, node_id, *literals]).fetchall()
    else:
        per = len(cols) + 2
        chunk = max(1, _sqlite_max_params(conn) // per)
        params = [x for row in zip([job_id] * n, [node_id] * n, *(v.tolist() for v in values), strict=True)
                  for x in row]
        one = f"({', '.join(['?'] * per)})"
        cur = conn.connection.driver_connection.cursor()
        rows = []
        for i in range(0, n, chunk):
            k = min(chunk, n - i)
            rows += cur.execute(f"INSERT INTO rl_spans ({names}) VALUES {', '.join([one] * k)} {tail}",
                                params[i * per:(i + k) * per]).fetchall()
        cur.close()
    if rows:
        a = np.array(rows, dtype=np.float64).reshape(len(rows), 6)
        rl_steps.add(conn, job_id, node_id, a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5])


def _sqlite_max_params(conn: Connection) -> int:
    """The most ``?`` parameters one SQLite statement may hold (999 on builds before 3.32)."""
    raw = conn.connection.driver_connection
    try:
        return raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    except AttributeError:  # Python < 3.11
        return 999


def _row(columns: Sequence[str], values: dict, job_id: str, node_id: str) -> tuple:
    full = values | {"job_id": job_id, "node_id": node_id}
    return tuple(full[c] for c in columns)


def rank_versions(engine: Engine, job_id: str, ranks: Iterable[int]) -> dict[int, tuple[float, int]]:
    """rank -> (latest span start, highest policy version) stored for ``ranks`` of the job."""
    ranks = sorted(set(ranks))
    if not ranks:
        return {}
    c = rt.rl_spans.c
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(c.rank, sa.func.max(c.start_ts), sa.func.max(c.version))
            .where(c.job_id == job_id, c.rank.in_(ranks)).group_by(c.rank)
        ).all()
    return {int(r): (float(s), int(v)) for r, s, v in rows}


def node_ranks(engine: Engine, node_id: str) -> tuple[str | None, set[int]]:
    """(job, ranks) the node's last hello declared; (None, empty) for an unknown node."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.nodes.c.job_id, t.nodes.c.ranks).where(t.nodes.c.node_id == node_id)).first()
    if row is None:
        return None, set()
    return row.job_id, {int(x) for x in (row.ranks or "").split(",") if x}


def _steps(col, step_start: int | None, step_end: int | None) -> list:
    out = []
    if step_start is not None:
        out.append(col >= step_start)
    if step_end is not None:
        out.append(col < step_end)
    return out


def read_spans(engine: Engine, job_id: str, step_start: int | None = None, step_end: int | None = None,
               *, limit: int = MAX_SPANS) -> Spans:
    """The job's spans of steps [step_start, step_end), ordered by step, rank and start; at
    most ``limit`` rows."""
    c = rt.rl_spans.c
    stmt = (sa.select(c.step, c.rank, c.version, c.phase, c.role, c.start_ts, c.end_ts, c.tokens, c.node_id)
            .where(c.job_id == job_id, *_steps(c.step, step_start, step_end))
            .order_by(c.step, c.rank, c.start_ts, c.phase).limit(limit))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    if not rows:
        return Spans.build([], [], [], [], [], [], [], [], node=[])
    cols = list(zip(*rows, strict=True))
    return Spans(
        np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int32), np.array(cols[2], dtype=np.int64),
        np.array(cols[3], dtype=np.int8), np.array(cols[4], dtype=np.int8), np.array(cols[5], dtype=np.float64),
        np.array(cols[6], dtype=np.float64), np.array(cols[7], dtype=np.int64), np.array(cols[8], dtype=object),
    )


def read_syncs(engine: Engine, job_id: str, step_start: int | None = None, step_end: int | None = None,
               *, limit: int = 10_000) -> list[dict]:
    c = rt.rl_weight_syncs.c
    stmt = (sa.select(rt.rl_weight_syncs).where(c.job_id == job_id, *_steps(c.step, step_start, step_end))
            .order_by(c.step, c.to_version, c.rank).limit(limit))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def read_batches(engine: Engine, job_id: str, step_start: int | None = None, step_end: int | None = None,
                 *, limit: int = 10_000) -> list[dict]:
    c = rt.rl_batches.c
    stmt = (sa.select(rt.rl_batches).where(c.job_id == job_id, *_steps(c.step, step_start, step_end))
            .order_by(c.step, c.rank).limit(limit))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def latest_step(engine: Engine, job_id: str) -> int | None:
    """The newest step with a stored span (None: none)."""
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.max(rt.rl_spans.c.step)).where(rt.rl_spans.c.job_id == job_id)).scalar()
