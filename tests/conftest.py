"""Shared fixtures: real PostgreSQL and Redis, free ports, subprocess helpers.

PostgreSQL and Redis are real servers. When one cannot be reached a test that needs it is
skipped locally but FAILS under ``CI=true``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = os.environ.get(
    "MOEPLANE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("MOEPLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session", autouse=True)
def _planner_kernel_compiled() -> None:
    """Compile the planner's repair kernel into numba's on-disk cache before any test: a
    server a test starts as a subprocess then loads it in about 0.3 s instead of compiling it
    for about 8 s inside the test's deadline."""
    from moeplane.controlplane.balancing.repair import warm_up

    warm_up()


def unavailable(what: str, why: object) -> None:
    """Fail under CI, skip elsewhere."""
    msg = f"{what} unreachable: {why}"
    if IN_CI:
        pytest.fail(msg + " (CI=true: a test that needs it must not be skipped)")
    pytest.skip(msg)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    import psycopg

    base = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    name = f"moeplane_t_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except Exception as exc:  # noqa: BLE001 - any connection failure
        unavailable("PostgreSQL", exc)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    head, _, _ = PG_ADMIN_URL.rpartition("/")
    try:
        yield f"{head}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_url() -> Iterator[str]:
    """URL of the real Redis server, with a private key prefix namespace per test via db 0."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
        client.ping()
    except Exception as exc:  # noqa: BLE001
        unavailable("Redis", exc)
    yield REDIS_URL
    client.close()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> str:
    """Each store test runs on both the embedded SQLite file and real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'moeplane.sqlite'}"
    return request.getfixturevalue("pg_url")
