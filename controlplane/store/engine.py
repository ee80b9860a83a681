"""Engine construction: SQLite (WAL, one file) or PostgreSQL (psycopg 3), from a URL."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` as psycopg 3 URLs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    """Build an engine. SQLite gets WAL mode, foreign keys, and a busy timeout."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql"):
        return sa.create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)
    raise ValueError(f"database_url: unsupported scheme in {url!r} (use sqlite:/// or postgresql://)")


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"
