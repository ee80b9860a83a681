"""Start ``moeplane agent`` as a real subprocess and talk to its NodeLocal socket.

Every process started here is registered; ``reap()`` (run after each test by
``tests/agents/conftest.py``) kills whatever a test left running, e.g. when an assertion
failed before its ``stop``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start_agent(tmp_path: Path, port: int, node_id: str = "node-0", *extra: str,
                interval: float = 0.1, spool: Path | None = None,
                env: dict[str, str] | None = None, host: str = "127.0.0.1") -> subprocess.Popen:
    log = open(tmp_path / f"agent-{node_id}.log", "ab")  # noqa: SIM115 - owned by the process
    cmd = [
        sys.executable, "-m", "moeplane.controlplane.cli.main", "agent", "--node-id", node_id,
        "--server", f"{host}:{port}", "--collector", "sim", "--devices", "4",
        "--interval", str(interval), "--spool-dir", str(spool or tmp_path / f"spool-{node_id}"),
        "--local-socket", str(tmp_path / f"{node_id}.sock"), "--seed", "7", *extra,
    ]
    full_env = {**os.environ, **(env or {})}
    return track(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env))


_started: list[subprocess.Popen] = []


def track(proc: subprocess.Popen) -> subprocess.Popen:
    """Register ``proc`` for :func:`reap`."""
    _started.append(proc)
    return proc


def reap() -> list[int]:
    """Kill every registered process still running; return their pids."""
    left = [p for p in _started if p.poll() is None]
    for p in left:
        p.kill()
    for p in left:
        p.wait(10)
    _started.clear()
    return [p.pid for p in left]


def stop_all(*procs: subprocess.Popen | None) -> list[int | None]:
    """Stop every process (also when stopping one fails); their exit codes, None if absent."""
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(None if p is None else stop(p))
        except subprocess.TimeoutExpired:
            codes.append(-9)
    return codes


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


def wait_path(path: Path, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Poll until ``path`` exists (the agent made its socket) or the agent died."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)
