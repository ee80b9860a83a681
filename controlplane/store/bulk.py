"""Set-based writes for ingest batches: one statement per table per batch, not one per record.

``claim`` inserts many rows with ON CONFLICT DO NOTHING and returns the keys that were new:
the exact dedup of row-by-row claims at a fraction of the round trips. On PostgreSQL the rows
travel as one array per column in a single ``INSERT ... SELECT * FROM unnest(...) ON CONFLICT
DO NOTHING RETURNING`` (one round trip; it replaced a COPY into a staging table followed by an
INSERT ... SELECT and a DELETE: four round trips); on SQLite (in-process, no round trips) one
executemany. Statements are compiled once per process (``run_compiled``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.sql import Executable

COPY_MIN_ROWS = 16  # below this a multi-row VALUES is as cheap as COPY + INSERT ... SELECT

# (dialect name, caller's key) -> (SQL text, positional bind order or None, bind processors)
_COMPILED: dict[tuple[str, Hashable], tuple[str, tuple[str, ...] | None, dict]] = {}


def run_compiled(conn: Connection, key: Hashable, build: Callable[[Connection], Executable],
                 params: dict | Sequence[dict]) -> CursorResult:
    """Execute the statement ``build(conn)`` with ``params`` (one dict, or a list: executemany),
    compiling it once per dialect and ``key``.

    SQLAlchemy does not cache the compilation of INSERT ... ON CONFLICT (its cache key is
    None), so the ingest path compiled each such statement on every call: ~0.4 ms of CPU per
    upsert. ``build`` must return the same statement for the same ``key``, with every value
    a bind parameter (``sa.bindparam``) named by the keys of ``params``.
    """
    dialect = conn.dialect
    entry = _COMPILED.get((dialect.name, key))
    if entry is None:
        compiled = build(conn).compile(dialect=dialect)
        procs = {name: proc for name, proc in (compiled._bind_processors or {}).items()
                 if isinstance(name, str)}
        entry = (compiled.string, tuple(compiled.positiontup) if compiled.positional else None, procs)
        _COMPILED[(dialect.name, key)] = entry
    sql, order, procs = entry

    def convert(p: dict):
        if procs:
            p = {k: (procs[k](v) if k in procs else v) for k, v in p.items()}
        return p if order is None else tuple(p[name] for name in order)

    if isinstance(params, dict):
        return conn.exec_driver_sql(sql, convert(params))
    return conn.exec_driver_sql(sql, [convert(p) for p in params])


def dialect_insert(conn: Connection, table: sa.Table):
    """INSERT with ON CONFLICT support for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def _unnest_sql(conn: Connection, table: sa.Table, columns: Sequence[str], tail: str) -> str:
    """PostgreSQL ``INSERT INTO table (columns) SELECT * FROM unnest(%b::type[], ...) <tail>``:
    a whole batch as one statement with one array parameter per column, each sent in binary
    (``%b``): psycopg escapes text arrays item by item with regular expressions (the frames of
    a batch spent ~20 us each there, for their bytea and node id) and the server parsed the text."""
    key = ("unnest", table.name, tuple(columns), tail)
    sql = _SQL.get(key)
    if sql is None:
        types = [table.c[c].type.compile(dialect=conn.dialect) for c in columns]
        cols = ", ".join(f'"{c}"' for c in columns)
        arrays = ", ".join(f"%b::{ty}[]" for ty in types)
        sql = _SQL[key] = f"INSERT INTO {table.name} ({cols}) SELECT * FROM unnest({arrays}) {tail}"
    return sql


_SQL: dict[tuple, str] = {}


def _unnest(conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple], tail: str):
    """Run ``_unnest_sql`` with ``rows`` (tuples in ``columns`` order); returns the cursor."""
    arrays = [list(col) for col in zip(*rows, strict=True)]
    return conn.connection.driver_connection.execute(_unnest_sql(conn, table, columns, tail), arrays)


def claim(conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple],
          key: Sequence[str]) -> set[tuple]:
    """Insert ``rows`` (tuples in ``columns`` order) unless their ``key`` exists; return new keys.

    A key repeated within ``rows`` is inserted once (and returned once). One statement per
    call: on PostgreSQL the rows travel as one array per column (``unnest``); on SQLite as
    SQLAlchemy's multi-row VALUES ... RETURNING.
    """
    if not rows:
        return set()
    keys = ", ".join(f'"{k}"' for k in key)
    if conn.dialect.name == "postgresql":
        cur = _unnest(conn, table, columns, rows, f"ON CONFLICT ({keys}) DO NOTHING RETURNING {keys}")
        return {tuple(r) for r in cur.fetchall()}
    # SQLite: executemany cannot return rows; SQLAlchemy's multi-row VALUES with RETURNING can
    key_cols = [table.c[k] for k in key]
    stmt = dialect_insert(conn, table).on_conflict_do_nothing(index_elements=key_cols).returning(*key_cols)
    return {tuple(r) for r in conn.execute(stmt, [dict(zip(columns, row, strict=True)) for row in rows])}


def upsert_rows(conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple],
                key: Sequence[str], *, newer_than: str | None = None) -> None:
    """Insert ``rows`` or overwrite the row with the same ``key`` (keys unique within ``rows``).

    ``newer_than``: a column; an existing row is only overwritten when its value is <= the
    proposed row's (e.g. a timestamp: never replace a newer row with an older one).
    """
    if not rows:
        return
    update = [c for c in columns if c not in key]
    keys = ", ".join(f'"{k}"' for k in key)
    if conn.dialect.name == "postgresql":
        sets = ", ".join(f'"{c}" = excluded."{c}"' for c in update)
        where = f' WHERE {table.name}."{newer_than}" <= excluded."{newer_than}"' if newer_than else ""
        _unnest(conn, table, columns, rows, f"ON CONFLICT ({keys}) DO UPDATE SET {sets}{where}")
        return

    def build(c: Connection):
        ins = dialect_insert(c, table)
        return ins.values({col: sa.bindparam(col) for col in columns}).on_conflict_do_update(
            index_elements=[table.c[k] for k in key], set_={col: ins.excluded[col] for col in update},
            where=None if newer_than is None else table.c[newer_than] <= ins.excluded[newer_than],
        )

    run_compiled(conn, ("upsert_rows", table.name, tuple(columns), tuple(key), newer_than), build,
                 [dict(zip(columns, row, strict=True)) for row in rows])


_TYPES: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}


def _column_types(driver, table: str, columns: tuple[str, ...]) -> list[int]:
    """Type oids of ``columns`` of ``table`` as the server has them (binary COPY sends each
    value in its column's binary format, so it must name them); read once per database."""
    key = (driver.info.dbname, table, columns)
    oids = _TYPES.get(key)
    if oids is None:
        found = dict(driver.execute(
            "SELECT attname, atttypid::int FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped", (table,),
        ).fetchall())
        oids = _TYPES[key] = [found[c] for c in columns]
    return oids


def insert(conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple],
           *, ignore_conflicts_on: Sequence[str] | None = None) -> None:
    """Insert ``rows``; with ``ignore_conflicts_on`` (a unique key) existing keys are skipped.

    PostgreSQL: plain inserts of ``COPY_MIN_ROWS`` or more go by binary COPY (values in their
    columns' binary formats: no text escaping of bytea on our side, no parsing on the
    server's), the rest as one ``unnest`` statement; SQLite: one executemany of a statement
    compiled once.
    """
    if not rows:
        return
    cols = ", ".join(f'"{c}"' for c in columns)
    if conn.dialect.name == "postgresql":
        if ignore_conflicts_on is None and len(rows) >= COPY_MIN_ROWS:
            driver = conn.connection.driver_connection
            types = _column_types(driver, table.name, tuple(columns))
            with driver.cursor() as cur, cur.copy(f"COPY {table.name} ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(types)
                for row in rows:
                    cp.write_row(row)
            return
        tail = ""
        if ignore_conflicts_on is not None:
            tail = "ON CONFLICT ({}) DO NOTHING".format(", ".join(f'"{k}"' for k in ignore_conflicts_on))
        _unnest(conn, table, columns, rows, tail)
        return

    def build(c: Connection):
        stmt = dialect_insert(c, table).values({col: sa.bindparam(col) for col in columns})
        if ignore_conflicts_on is not None:
            stmt = stmt.on_conflict_do_nothing(index_elements=[table.c[k] for k in ignore_conflicts_on])
        return stmt

    run_compiled(conn, ("insert", table.name, tuple(columns), tuple(ignore_conflicts_on or ())), build,
                 [dict(zip(columns, row, strict=True)) for row in rows])
