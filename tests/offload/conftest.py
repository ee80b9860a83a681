"""A running control plane with two scripted node agents of job-1 (2 devices each)."""

from __future__ import annotations

import httpx
import pytest

from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello
from tests.controlplane.serverthread import running_server


@pytest.fixture
def cluster(database_url):
    """(http client at /api/v1/jobs/job-1, agent of node-0 [ranks 0, 1], agent of node-1 [2, 3])."""
    with running_server(database_url, controller_interval_s=0.05) as srv:
        http = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/job-1", timeout=10)
        a0, a1 = ScriptedAgent(srv["grpc_port"], "node-0"), ScriptedAgent(srv["grpc_port"], "node-1")
        for agent, node, ranks in ((a0, "node-0", [0, 1]), (a1, "node-1", [2, 3])):
            aio.run(agent.__aenter__())
            msg = hello(node, devices=2)
            msg.hello.ranks[:] = ranks
            agent.send(msg)
            aio.run(agent.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r)))
        yield http, a0, a1
        for agent in (a0, a1):
            aio.run(agent.__aexit__(None, None, None))
        http.close()
