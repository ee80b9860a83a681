"""REST over real HTTP: data reads back; bad parameters get 4xx JSON, never 500."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, loads, samples
from tests.controlplane.serverthread import running_server


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'a.sqlite'}"
    with running_server(url) as srv:

        async def fill():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                agent.send(samples(1, ts=100.0))
                agent.send(samples(2, ts=101.0))
                agent.send(loads(3, step=0, counts=np.ones((4, 8), dtype=np.int64), ts=100.0))
                agent.send(loads(4, step=1, counts=2 * np.ones((4, 8), dtype=np.int64), ts=110.0))
                await agent.wait_acks([1, 2, 3, 4])

        aio.run(fill())
        with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=10) as c:
            yield c


def test_reads(api):
    assert api.get("/health").json()["status"] == "ok"
    assert [j["job_id"] for j in api.get("/jobs").json()] == ["job-1"]
    assert api.get("/jobs/job-1").json()["layers"] == 4
    assert len(api.get("/devices", params={"job_id": "job-1"}).json()) == 2
    assert api.get("/nodes").json()[0]["node_id"] == "node-0"
    latest = api.get("/devices/latest").json()
    assert latest[0]["metrics"]["temperature_celsius"] == 60.0
    hist = api.get("/devices/node-0/gpu0/samples", params={"metric": "utilization_ratio", "start": 101}).json()
    assert hist == [{"ts": 101.0, "metric": "utilization_ratio", "value": 0.5}]
    assert api.get("/jobs/job-1/loads/latest").json()["step"] == 1
    steps = api.get("/jobs/job-1/loads", params={"step_start": 1, "layer": 2}).json()
    assert [s["step"] for s in steps] == [1] and steps[0]["counts"] == [2] * 8
    assert httpx.get(str(api.base_url).removesuffix("/api/v1/") + "/openapi.json").json()["info"]["title"] == "moeplane"


@pytest.mark.parametrize(
    "path,params,status",
    [
        ("/jobs/none", {}, 404),
        ("/jobs/none/loads", {}, 404),
        ("/devices/none/samples", {}, 404),
        ("/devices/node-0/gpu0/samples", {"metric": "no_such_metric"}, 404),
        ("/jobs/job-1/loads", {"limit": 0}, 422),
        ("/jobs/job-1/loads", {"limit": "ten"}, 422),
        ("/jobs/job-1/loads", {"step_start": 5, "step_end": 2}, 422),
        ("/jobs/job-1/loads", {"start": -1}, 422),
        ("/jobs/job-1/loads", {"layer": 99}, 422),
        ("/jobs/job-1/steps", {"rank": -2}, 422),
    ],
)
def test_bad_parameters_are_4xx_json(api, path, params, status):
    r = api.get(path, params=params)
    assert r.status_code == status, r.text
    assert "detail" in r.json()
