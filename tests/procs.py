"""Real processes for end-to-end tests: start ``moeplane`` subcommands and wait on their state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.conftest import free_port

MOEPLANE = [sys.executable, "-m", "moeplane.controlplane.cli.main"]


def wait_until(fn, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except (httpx.HTTPError, OSError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc!r})")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    info: dict = field(default_factory=dict)

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                return self.popen.wait(10)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def spawn(name: str, args: list[str], tmp: Path, env: dict | None = None) -> Proc:
    log = tmp / f"{name}.log"
    fh = open(log, "wb")  # noqa: SIM115 - closed with the process
    e = os.environ.copy() | {"PYTHONUNBUFFERED": "1"} | (env or {})
    popen = subprocess.Popen(MOEPLANE + args, stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True)
    return Proc(name, popen, log)


def start_serve(tmp: Path, database_url: str, redis_url: str = "", name: str = "serve", extra=()) -> Proc:
    http_port, grpc_port = free_port(), free_port()
    args = ["serve", "--database-url", database_url, "--http-port", str(http_port),
            "--grpc-listen", f"127.0.0.1:{grpc_port}", *extra]
    if redis_url:
        args += ["--redis-url", redis_url]
    proc = spawn(name, args, tmp)
    proc.info = {"http": f"http://127.0.0.1:{http_port}", "grpc_port": grpc_port, "grpc": f"127.0.0.1:{grpc_port}"}

    def healthy():
        if proc.popen.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.popen.returncode}:\n{proc.output()}")
        return httpx.get(proc.info["http"] + "/api/v1/health", timeout=2).status_code == 200

    wait_until(healthy, 60, f"{name} to serve")
    return proc
