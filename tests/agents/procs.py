"""``moeplane agent`` and ``moeplane simulate`` as real subprocesses, started through
:mod:`moeplane.controlplane.procs`.

Every process started here joins one group; ``reap()`` (run after each test by
``tests/agents/conftest.py``) stops whatever a test left running, e.g. when an assertion failed
before its ``stop``.
"""

from __future__ import annotations

import signal
from pathlib import Path

from moeplane.controlplane.procs import Proc, Procs, spawn, wait_until

_group = Procs(Path("."))


def track(proc: Proc) -> Proc:
    """Add ``proc`` to the group :func:`reap` stops."""
    return _group.add(proc)


def start_agent(tmp_path: Path, port: int, node_id: str = "node-0", *extra: str,
                interval: float = 0.1, spool: Path | None = None,
                env: dict[str, str] | None = None, host: str = "127.0.0.1") -> Proc:
    """A sim-collector agent (4 devices) uplinked to ``host:port``, its NodeLocal socket at
    ``tmp_path/<node_id>.sock``, its log at ``tmp_path/agent-<node_id>.log``."""
    argv = [
        "agent", "--node-id", node_id, "--server", f"{host}:{port}", "--collector", "sim",
        "--devices", "4", "--interval", str(interval),
        "--spool-dir", str(spool or tmp_path / f"spool-{node_id}"),
        "--local-socket", str(tmp_path / f"{node_id}.sock"), "--seed", "7", *extra,
    ]
    return track(spawn(f"agent-{node_id}", argv, tmp_path, env=env))


def start_simulate(tmp_path: Path, *argv: str) -> Proc:
    """``moeplane simulate <argv>``, its log at ``tmp_path/simulate.log``."""
    return track(spawn("simulate", ["simulate", *argv], tmp_path))


def reap() -> list[int]:
    """Stop every process of the group still running; return their pids."""
    return [p.pid for p in _group.reap(grace=10)]


def stop(proc: Proc, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Stop ``proc`` with ``sig`` (killed after ``timeout`` s); its exit code."""
    return proc.stop(sig, timeout)


def stop_all(*procs: Proc | None) -> list[int | None]:
    """Stop every process given; their exit codes (None for a missing one)."""
    return [None if p is None else p.stop(timeout=10) for p in procs]


def wait_path(path: Path, proc: Proc, timeout: float = 20.0) -> None:
    """Wait until ``path`` exists (the agent made its socket); raise if the process exited."""

    def made() -> bool:
        proc.check_running()
        return path.exists()

    wait_until(made, timeout, f"{path}")
