"""Child ``moeplane`` processes: start one with its log, wait on state with a deadline, stop and
reap them.

``moeplane demo`` runs the control plane, agents and the simulator as children with these; the
tests and benchmarks start the same processes the same way. Waiting is always a deadline poll
(:func:`wait_until`), never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MOEPLANE = [sys.executable, "-m", "moeplane.controlplane.cli.main"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(fn: Callable[[], T], timeout: float = 30.0, what: str = "condition", *,
               interval: float = 0.05,
               retry_on: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Call ``fn`` until it returns something truthy and return that; an exception of a type in
    ``retry_on`` counts as not yet. Raises TimeoutError naming ``what`` (and the last such
    exception) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except retry_on as exc:
            last = exc
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}"
                               + (f" (last error: {last!r})" if last else ""))
        time.sleep(min(interval, left))


@dataclass
class Proc:
    """A started child: its name, process, log file and (for ``serve``) its addresses."""

    name: str
    popen: subprocess.Popen
    log: Path
    http: str = ""  # http://127.0.0.1:PORT
    grpc: str = ""  # 127.0.0.1:PORT

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def grpc_port(self) -> int:
        return int(self.grpc.rsplit(":", 1)[1])

    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """The process's log so far (stdout and stderr)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def check_running(self) -> None:
        """Raise RuntimeError with the log's tail if the process has exited."""
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n"
                               f"{self.output()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send ``sig`` and wait up to ``timeout`` s; kill it if it is still running. Returns the
        exit code (negative: the signal that ended it)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(10)


def spawn(name: str, argv: list[str], log_dir: Path, *, env: dict[str, str] | None = None,
          cmd: list[str] | None = None) -> Proc:
    """Start ``moeplane <argv>`` (or ``cmd + argv``) in its own session, stdout and stderr
    appended to ``log_dir/<name>.log``; ``env`` adds to this process's environment."""
    log = Path(log_dir) / f"{name}.log"
    with open(log, "ab") as fh:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            (MOEPLANE if cmd is None else cmd) + argv, stdout=fh, stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}), start_new_session=True)
    return Proc(name, popen, log)


def http_ok(url: str, timeout: float = 2.0, context: ssl.SSLContext | None = None) -> bool:
    """Whether ``GET url`` answers 200 (OSError when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:  # noqa: S310
            return r.status == 200
    except urllib.error.HTTPError as exc:  # an answer other than 2xx: not ready yet
        exc.close()
        return False


def start_serve(log_dir: Path, database_url: str, *, name: str = "serve",
                http_port: int | None = None, grpc_port: int | None = None,
                redis_url: str = "", extra: Iterable[str] = (), env: dict[str, str] | None = None,
                tls_ca: Path | None = None, timeout: float = 90.0) -> Proc:
    """Start ``moeplane serve`` on 127.0.0.1 (free ports unless given) and wait until
    ``/api/v1/health`` answers; stop it and raise if it exits or does not answer in time.
    ``tls_ca``: the server has TLS flags among ``extra``, with a certificate for ``localhost``
    that this CA file verifies (``Proc.http`` is then ``https://localhost:PORT``)."""
    http_port = http_port or free_port()
    grpc_port = grpc_port or free_port()
    argv = ["serve", "--database-url", database_url, "--http-port", str(http_port),
            "--grpc-listen", f"127.0.0.1:{grpc_port}", *extra]
    if redis_url:
        argv += ["--redis-url", redis_url]
    proc = spawn(name, argv, log_dir, env=env)
    proc.grpc = f"127.0.0.1:{grpc_port}"
    proc.http = f"https://localhost:{http_port}" if tls_ca else f"http://127.0.0.1:{http_port}"
    context = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else None

    def healthy() -> bool:
        proc.check_running()
        return http_ok(proc.http + "/api/v1/health", context=context)

    try:
        wait_until(healthy, timeout, f"{name} to serve")
    except (TimeoutError, RuntimeError):
        proc.stop(signal.SIGKILL)
        raise
    return proc


@dataclass
class Procs:
    """Every process started through it, stopped together: newest first, SIGTERM, then a kill
    for those still running after the grace period."""

    log_dir: Path
    started: list[Proc] = field(default_factory=list)

    def add(self, proc: Proc) -> Proc:
        self.started.append(proc)
        return proc

    def spawn(self, name: str, argv: list[str], **kw) -> Proc:
        return self.add(spawn(name, argv, self.log_dir, **kw))

    def start_serve(self, database_url: str, **kw) -> Proc:
        return self.add(start_serve(self.log_dir, database_url, **kw))

    def reap(self, grace: float = 15.0) -> list[Proc]:
        """Stop every process still running; return those that were."""
        left = [p for p in reversed(self.started) if p.running()]
        for p in left:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in left:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)
        self.started.clear()
        return left
