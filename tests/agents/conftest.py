"""Every agent test ends with none of its processes running (see ``procs.reap``)."""

from __future__ import annotations

import grpc
import pytest

from tests.agents.procs import reap, start_agent, stop, wait_path
from tests.agents.server import Server


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    yield
    reap()


@pytest.fixture
def agent_args() -> tuple[str, ...]:
    """More ``moeplane agent`` arguments for ``local_agent`` (a test module overrides this)."""
    return ()


@pytest.fixture
def server_args() -> dict:
    """``Server`` arguments for ``local_agent`` (a test module overrides this)."""
    return {}


@pytest.fixture
def local_agent_process(tmp_path, agent_args, server_args):
    """A real agent process (node-0, job j1, ranks 0-1, plus ``agent_args``) uplinked to a real
    ``moeplane serve`` on SQLite: yields (server, agent process, channel), the channel to the
    agent's NodeLocal Unix socket; the agent must exit 0 when stopped (by the test or here)."""
    server = Server(tmp_path, **server_args).start()
    agent = start_agent(tmp_path, server.port, "node-0", "--job-id", "j1", "--ranks", "0-1",
                        *agent_args)
    channel = None
    try:
        wait_path(tmp_path / "node-0.sock", agent)
        channel = grpc.insecure_channel(f"unix:{tmp_path / 'node-0.sock'}")
        yield server, agent, channel
    finally:
        if channel is not None:
            channel.close()
        code = stop(agent)
        server.close()
    assert code == 0


@pytest.fixture
def local_agent(local_agent_process):
    """:func:`local_agent_process` without the process: yields (server, channel)."""
    server, _, channel = local_agent_process
    return server, channel
