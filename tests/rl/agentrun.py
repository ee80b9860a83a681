"""A control plane in a thread and one real node agent process (job ``grpo``, rank 0, one sim
device) with its NodeLocal socket, for the rank SDK's end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moeplane.controlplane.procs import spawn, wait_until
from tests.controlplane.serverthread import running_server


@contextmanager
def sdk_agent(tmp_path: Path) -> Iterator[tuple[dict, str]]:
    """(the running server's dict, the agent's socket path) once the agent made its socket; the
    agent is stopped on exit."""
    sock = str(tmp_path / "agent.sock")
    with running_server(f"sqlite:///{tmp_path / 'rl.sqlite'}") as srv:
        agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", f"127.0.0.1:{srv['grpc_port']}",
                                "--collector", "sim", "--devices", "1", "--job-id", "grpo", "--ranks", "0",
                                "--local-socket", sock, "--spool-dir", str(tmp_path / "spool"),
                                "--interval", "0.5"], tmp_path)
        try:
            wait_until(lambda: (tmp_path / "agent.sock").exists(), 60, "the agent's socket")
            yield srv, sock
        finally:
            agent.stop()
