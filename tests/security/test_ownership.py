"""A node writes only what it owns (issue 33, items 1-3): real gRPC into a real server, on
SQLite and PostgreSQL.

node-0 runs ranks 0, 1 on node-0/gpu0, node-0/gpu1; node-1 ranks 2, 3 on its own devices.
"""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from moeplane.controlplane.store import queries as q
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.controlplane.agentclient import hello, loads
from tests.controlplane.serverthread import running_server
from tests.security.stream import Agent

OK, INVALID_ARGUMENT, PERMISSION_DENIED = 0, 3, 7
COUNTS = np.full((4, 8), 3, dtype=np.int64)


def step_stats(seq: int, step: int, ranks, job_id: str = "job-1") -> pb.AgentMessage:
    return pb.AgentMessage(seq=seq, step_stats=pb.StepStats(
        job_id=job_id, step=step, timestamp=1000.0,
        ranks=[pb.RankStepStats(rank=r, step_time_s=0.5, host_bound_ratio=0.1, tokens=100) for r in ranks]))


@pytest.fixture
def srv(database_url):
    with running_server(database_url) as info:
        info["http"] = httpx.Client(base_url=f"http://127.0.0.1:{info['http_port']}/api/v1", timeout=10)
        yield info
        info["http"].close()


async def _joined(port: int, node_id: str, first_rank: int, **kw) -> Agent:
    agent = await Agent(port, node_id).__aenter__()
    agent.send(hello(node_id, first_rank=first_rank, **kw))
    await agent.config()
    return agent


def test_a_conflicting_job_spec_is_refused_and_the_job_unchanged(srv):
    async def script():
        a0 = await _joined(srv["grpc_port"], "node-0", 0)
        async with Agent(srv["grpc_port"], "node-1") as b:
            b.send(hello("node-1", first_rank=2, layers=7, experts=8))
            assert await b.wait_ended() == grpc.StatusCode.INVALID_ARGUMENT
            assert "hello.job.layers" in b.details
        a0.send(loads(1, step=1, counts=COUNTS))  # the honest agent's loads still fit
        acks = await a0.wait_acks([1])
        await a0.__aexit__(None, None, None)
        return acks

    acks = aio.run(script())
    assert acks[1].code == OK, acks[1].message
    job = srv["http"].get("/jobs/job-1").json()
    assert (job["layers"], job["experts"]) == (4, 8)


def test_a_device_of_another_node_is_refused_until_an_operator_releases_it(srv):
    def thief_hello():
        msg = hello("node-1", first_rank=2)
        msg.hello.devices[0].device_id = "node-0/gpu0"
        return msg

    async def script():
        a0 = await _joined(srv["grpc_port"], "node-0", 0)
        await a0.__aexit__(None, None, None)
        async with Agent(srv["grpc_port"], "node-1") as b:
            b.send(thief_hello())
            status = await b.wait_ended()
        return status, b.details

    status, details = aio.run(script())
    assert status == grpc.StatusCode.PERMISSION_DENIED and "node-0/gpu0" in details
    owners = {d["device_id"]: d["node_id"] for d in srv["http"].get("/devices").json()}
    assert owners["node-0/gpu0"] == "node-0"

    released = srv["http"].delete("/nodes/node-0/claims")
    assert released.status_code == 200 and released.json()["ranks"] == [0, 1]

    async def again():
        b = await Agent(srv["grpc_port"], "node-1").__aenter__()
        b.send(thief_hello())
        await b.config()
        await b.__aexit__(None, None, None)

    aio.run(again())
    owners = {d["device_id"]: d["node_id"] for d in srv["http"].get("/devices").json()}
    assert owners["node-0/gpu0"] == "node-1"


def test_a_node_writes_only_its_own_ranks(srv):
    async def script():
        a0 = await _joined(srv["grpc_port"], "node-0", 0)
        b = await _joined(srv["grpc_port"], "node-1", 2)
        # node-1 writes node-0's ranks first: refused, so node-0's own rows are not "duplicates"
        b.send(loads(1, step=5, counts=COUNTS, ranks=(0, 1)))
        b.send(step_stats(2, 5, [0]))
        b.send(loads(3, step=5, counts=COUNTS, ranks=(2, 3)))
        b.send(step_stats(4, 5, [2, 3]))
        b_acks = await b.wait_acks([1, 2, 3, 4])
        a0.send(loads(1, step=5, counts=COUNTS))
        a0.send(step_stats(2, 5, [0, 1]))
        a_acks = await a0.wait_acks([1, 2])
        # announcing ranks another node holds is refused, the stream's earlier ranks stay
        async with Agent(srv["grpc_port"], "node-2") as c:
            c.send(hello("node-2", first_rank=1, devices=2))
            status = await c.wait_ended()
        for agent in (a0, b):
            await agent.__aexit__(None, None, None)
        return b_acks, a_acks, status

    b_acks, a_acks, overlap = aio.run(script())
    assert b_acks[1].code == PERMISSION_DENIED and "[0, 1]" in b_acks[1].message
    assert b_acks[2].code == PERMISSION_DENIED and "step_stats.ranks" in b_acks[2].message
    assert b_acks[3].code == OK and b_acks[4].code == OK
    assert a_acks[1].code == OK and not a_acks[1].duplicate
    assert a_acks[2].code == OK and not a_acks[2].duplicate
    assert overlap == grpc.StatusCode.PERMISSION_DENIED
    engine = srv["engine"]
    latest = q.latest_loads(engine, "job-1")
    assert latest["nodes_reported"] == 2
    np.testing.assert_array_equal(latest["counts"], 2 * COUNTS)
    rows = {r["rank"]: r["node_id"] for r in srv["http"].get("/jobs/job-1/steps").json()}
    assert rows == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}


def test_a_step_far_ahead_of_the_job_is_refused(srv):
    async def script():
        a0 = await _joined(srv["grpc_port"], "node-0", 0)
        a0.send(loads(1, step=10, counts=COUNTS))
        await a0.wait_acks([1])
        a0.send(loads(2, step=10**12, counts=COUNTS))
        a0.send(step_stats(3, 10**12, [0]))
        a0.send(loads(4, step=10 + 1_000_000, counts=COUNTS))  # at the bound: a resume may jump
        acks = await a0.wait_acks([2, 3, 4])
        await a0.__aexit__(None, None, None)
        return acks

    acks = aio.run(script())
    assert acks[2].code == INVALID_ARGUMENT and "loads.step" in acks[2].message
    assert acks[3].code == INVALID_ARGUMENT and "step_stats.step" in acks[3].message
    assert acks[4].code == OK
    assert srv["http"].get("/jobs/job-1").json()["latest_step"] == 1_000_010


def test_memory_profiles_and_plan_reports_of_others_are_refused(srv):
    from tests.offload.profiles import device_profile

    def memory(seq: int, device_id: str, rank: int, job_id: str = "job-1") -> pb.AgentMessage:
        return pb.AgentMessage(seq=seq, memory=pb.MemoryProfiles(
            job_id=job_id, step=1, timestamp=1000.0, host_free_bytes=1 << 30,
            devices=[device_profile(device_id, rank)]))

    async def script():
        a0 = await _joined(srv["grpc_port"], "node-0", 0)
        b = await _joined(srv["grpc_port"], "node-1", 2)
        b.send(memory(1, "node-1/gpu0", 0))  # its device, but node-0's rank
        b.send(memory(2, "node-0/gpu0", 0))  # node-0's device
        b.send(memory(3, "node-1/gpu0", 2))  # its own
        b.send(pb.AgentMessage(seq=4, plan_report=pb.PlanReport(
            job_id="job-2", epoch=1, state=pb.PLAN_STATE_APPLIED, step=1)))
        acks = await b.wait_acks([1, 2, 3, 4])
        for agent in (a0, b):
            await agent.__aexit__(None, None, None)
        return acks

    acks = aio.run(script())
    assert acks[1].code == PERMISSION_DENIED and "memory.devices.rank" in acks[1].message
    assert acks[2].code == INVALID_ARGUMENT and "node-0/gpu0" in acks[2].message
    assert acks[3].code == OK, acks[3].message
    assert acks[4].code == PERMISSION_DENIED and "job-2" in acks[4].message
