"""Shared harness of the scale benchmarks: real ``moeplane serve`` / ``loadgen`` processes,
fresh PostgreSQL databases, and CPU meters read from /proc (psutil) of processes by pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

PG_ADMIN = os.environ.get("MOEPLANE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("MOEPLANE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
MOEPLANE = [sys.executable, "-m", "moeplane.controlplane.cli.main"]
# The rebalancing controller's first tick finds no job; this interval keeps it from planning
# during an ingest measurement (its planning cost is the planner benchmark's subject).
NO_CONTROLLER = {"MOEPLANE_CONTROLLER_INTERVAL_S": "1e9"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@dataclass
class Serve:
    popen: subprocess.Popen
    grpc: str
    http: str
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def start_serve(database_url: str, tmp: Path, *, redis_url: str = "", name: str = "serve",
                grpc_port: int | None = None, http_port: int | None = None,
                env: dict | None = None) -> Serve:
    """Start ``moeplane serve`` and wait until /health answers. ``env``: extra environment."""
    grpc_port = grpc_port or free_port()
    http_port = http_port or free_port()
    args = ["serve", "--database-url", database_url, "--grpc-listen", f"127.0.0.1:{grpc_port}",
            "--http-port", str(http_port), "--no-dashboard"]
    if redis_url:
        args += ["--redis-url", redis_url]
    log = tmp / f"{name}.log"
    popen = subprocess.Popen(MOEPLANE + args, stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                             env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}), start_new_session=True)
    srv = Serve(popen, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}", log)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(srv.http + "/api/v1/health", timeout=2).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    srv.stop(signal.SIGKILL)
    raise RuntimeError(f"{name} did not become healthy:\n{log.read_text()[-3000:]}")


def loadgen(targets: list[str], tmp: Path, *args: str, name: str = "loadgen") -> subprocess.Popen:
    """Start ``moeplane loadgen`` (its JSON observations go to tmp/<name>.json)."""
    cmd = MOEPLANE + ["loadgen", *sum((["--target", t] for t in targets), []),
                      "--json", str(tmp / f"{name}.json"), *args]
    return subprocess.Popen(cmd, stdout=open(tmp / f"{name}.out", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)


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
