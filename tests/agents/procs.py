"""Start ``moeplane agent`` as a real subprocess and talk to its NodeLocal socket."""

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
        sys.executable, "-m", "controlplane.cli.main", "agent", "--node-id", node_id,
        "--server", f"{host}:{port}", "--collector", "sim", "--devices", "4",
        "--interval", str(interval), "--spool-dir", str(spool or tmp_path / f"spool-{node_id}"),
        "--local-socket", str(tmp_path / f"{node_id}.sock"), "--seed", "7", *extra,
    ]
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)


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
