"""Shared harness of the scale benchmarks: real ``moeplane serve`` / ``loadgen`` processes,
fresh PostgreSQL databases, and CPU meters read from /proc (psutil) of processes by pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from moeplane.controlplane import procs
from moeplane.controlplane.procs import Proc, free_port

__all__ = ["NO_CONTROLLER", "PG_ADMIN", "REDIS", "Meter", "cpu_of", "free_port",
           "loadgen", "pg_database", "postgres_cpu", "read_json", "sqlite_database", "start_serve"]

PG_ADMIN = os.environ.get("MOEPLANE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("MOEPLANE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
# The rebalancing controller's first tick finds no job; this interval keeps it from planning
# during an ingest measurement (its planning cost is the planner benchmark's subject).
NO_CONTROLLER = {"MOEPLANE_CONTROLLER_INTERVAL_S": "1e9"}


@contextmanager
def pg_database():
    """Yield the SQLAlchemy URL of a fresh PostgreSQL database; drop it afterwards."""
    import psycopg

    name = f"moeplane_b_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    head = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{head}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def sqlite_database():
    with tempfile.TemporaryDirectory(prefix="moeplane-bench-") as tmp:
        yield f"sqlite:///{tmp}/bench.sqlite"


def postgres_cpu() -> float:
    """User+system CPU seconds of every PostgreSQL server process on this machine."""
    total = 0.0
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] and p.info["name"].startswith("postgres"):
                c = p.cpu_times()
                total += c.user + c.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def cpu_of(pid: int) -> float:
    c = psutil.Process(pid).cpu_times()
    return c.user + c.system


def start_serve(database_url: str, tmp: Path, *, name: str = "serve", **kw) -> Proc:
    """``moeplane serve`` without its dashboard (:func:`procs.start_serve`: free ports unless
    given, waits for /health), its log under ``tmp``."""
    return procs.start_serve(tmp, database_url, name=name, extra=["--no-dashboard"], **kw)


def loadgen(targets: list[str], tmp: Path, *args: str, name: str = "loadgen") -> subprocess.Popen:
    """Start ``moeplane loadgen`` (its JSON observations go to tmp/<name>.json)."""
    argv = ["loadgen", *sum((["--target", t] for t in targets), []),
            "--json", str(tmp / f"{name}.json"), *args]
    return procs.spawn(name, argv, tmp).popen


def read_json(tmp: Path, name: str = "loadgen") -> dict:
    return json.loads((tmp / f"{name}.json").read_text())


@dataclass
class Meter:
    """Samples (unix time, CPU seconds of each pid, postgres CPU, RSS of each pid) every period."""

    pids: dict[str, int]
    period_s: float = 1.0
    samples: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while True:
            row = {"t": time.time(), "pg": postgres_cpu()}
            for name, pid in self.pids.items():
                try:
                    p = psutil.Process(pid)
                    c = p.cpu_times()
                    row[name] = c.user + c.system
                    row[name + "_rss"] = p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.samples.append(row)
            if self._stop.wait(self.period_s):
                return

    def delta(self, key: str, t0: float, t1: float) -> float:
        """Growth of ``key`` between the samples nearest to t0 and t1 (and the seconds between)."""
        rows = [r for r in self.samples if key in r]
        a = min(rows, key=lambda r: abs(r["t"] - t0))
        b = min(rows, key=lambda r: abs(r["t"] - t1))
        return b[key] - a[key], b["t"] - a["t"]
