"""A job's expert groups (``JobSpec.groups``) end to end over real gRPC and HTTP: the spec is
stored and shown, the controller's plans keep every replica of a group on one node, and a
spec whose groups do not fit the job, or contradict the job's, is refused naming
``job.groups``."""

from __future__ import annotations

import contextlib

import grpc
import httpx
import numpy as np
import pytest

from moeplane.controlplane.ingest.validate import hello_record
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.plan_codec import decode_full
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, loads

L, E, G, S, RANKS_PER_NODE, K = 4, 16, 4, 6, 2, 4  # 2 nodes of 2 ranks; 4 groups of 4 experts


def job_hello(node: str, ranks: list[int], groups: int = K) -> pb.AgentMessage:
    msg = hello(node, devices=2, layers=L, experts=E, first_rank=ranks[0])
    msg.hello.job.world_size = G
    msg.hello.job.slots_per_rank = S
    msg.hello.job.ranks_per_node = RANKS_PER_NODE
    msg.hello.job.groups = groups
    return msg


def skewed(step: int) -> np.ndarray:
    rng = np.random.default_rng(step)
    c = rng.integers(50, 150, size=(L, E))
    c[:, 8:12] *= 4  # group 2 hot: experts 6..11 sit on rank 1 alone under the identity
    return c


def plans_of(agent):
    return [m.plan for m in agent.received if m.WhichOneof("body") == "plan"]


def nodes_of_groups(phy2log: np.ndarray) -> list[list[set[int]]]:
    """Per layer and group, the nodes holding a replica of one of its experts."""
    node = np.arange(G * S) // S // RANKS_PER_NODE
    group = phy2log // (E // K)
    return [[set(node[group[lay] == g].tolist()) for g in range(K)] for lay in range(L)]


@contextlib.contextmanager
def connected(port: int, *hellos: pb.AgentMessage):
    """One ScriptedAgent per hello (named by its node), each sent its hello; closed on exit."""
    agents = [ScriptedAgent(port, m.hello.node_id) for m in hellos]
    for a in agents:
        aio.run(a.__aenter__())
    try:
        for a, m in zip(agents, hellos, strict=True):
            a.send(m)
        yield agents
    finally:
        for a in agents:
            aio.run(a.__aexit__(None, None, None))


def refused(port: int, msg: pb.AgentMessage) -> tuple[grpc.StatusCode, str]:
    async def script():
        async with ScriptedAgent(port, msg.hello.node_id) as agent:
            agent.send(msg)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await agent._reader
            return info.value.code(), info.value.details()

    return aio.run(script())


def assert_groups_kept(plan: pb.PlacementPlan) -> None:
    phy2log = decode_full(plan).astype(np.int64)
    assert phy2log.shape == (L, G * S)
    where = nodes_of_groups(phy2log)
    assert all(len(nodes) == 1 for row in where for nodes in row), where
    for row in where:  # K / N groups on each node
        assert np.bincount([min(n) for n in row], minlength=2).tolist() == [2, 2]
    # the identity placement it replaced split groups 0 and 1 over both nodes
    ident = np.tile(np.arange(G * S) % E, (L, 1))
    assert any(len(n) == 2 for row in nodes_of_groups(ident) for n in row)


def test_plans_of_a_job_with_groups_keep_each_group_on_one_node(database_url):
    from tests.controlplane.serverthread import running_server

    with (running_server(database_url, controller_interval_s=0.05) as srv,
          httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=10) as http,
          connected(srv["grpc_port"], job_hello("node-0", [0, 1]),
                    job_hello("node-1", [2, 3])) as (a0, a1)):
        for a in (a0, a1):
            aio.run(a.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r)))
        assert http.get("/jobs/job-1").json()["groups"] == K
        # a node whose spec says other groups is refused; the job keeps its spec
        code, details = refused(srv["grpc_port"], job_hello("node-2", [4, 5], groups=8))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "hello.job.groups" in details
        assert http.get("/jobs/job-1").json()["groups"] == K
        for i, step in enumerate(range(6)):
            c = skewed(step)
            a0.send(loads(1 + i, step, c // 2, ts=1000.0 + step))
            a1.send(loads(1 + i, step, c - c // 2, ts=1000.0 + step, ranks=(2, 3)))
        aio.run(a0.wait_for(lambda _r: plans_of(a0), timeout=30))
        assert_groups_kept(plans_of(a0)[0])
        # a dry run of the planner for this job keeps them too
        r = http.post("/jobs/job-1/plans/dry-run", json={"steps": 3, "incremental": False})
        assert r.status_code == 200, r.text
        where = nodes_of_groups(np.array(r.json()["phy2log"]))
        assert all(len(nodes) == 1 for row in where for nodes in row), where


def test_the_nodes_of_a_job_with_groups_are_the_specs_not_its_agents(tmp_path):
    """One agent announcing all four ranks: the spec's ranks_per_node = 2 still makes two
    nodes, and the plans keep each group on one of them."""
    from tests.controlplane.serverthread import running_server

    msg = job_hello("node-0", [0, 1])
    msg.hello.ranks[:] = [0, 1, 2, 3]
    with (running_server(f"sqlite:///{tmp_path / 'one.sqlite'}", controller_interval_s=0.05) as srv,
          connected(srv["grpc_port"], msg) as (agent,)):
        for i, step in enumerate(range(6)):
            agent.send(loads(1 + i, step, skewed(step), ts=1000.0 + step, ranks=(0, 1, 2, 3)))
        aio.run(agent.wait_for(lambda _r: plans_of(agent), timeout=30))
        assert_groups_kept(plans_of(agent)[0])


def test_the_first_hello_with_groups_that_do_not_fit_ends_the_stream(tmp_path):
    from tests.controlplane.serverthread import running_server

    with running_server(f"sqlite:///{tmp_path / 'g.sqlite'}") as srv:
        code, details = refused(srv["grpc_port"], job_hello("node-0", [0, 1], groups=3))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details == "hello.job.groups: groups = 3 does not divide the 16 experts"


def spec(**kw) -> pb.Hello:
    base = dict(job_id="j", layers=L, experts=E, world_size=G, slots_per_rank=S,
                ranks_per_node=RANKS_PER_NODE, groups=K)
    return pb.Hello(node_id="n", job_id="j", job=pb.JobSpec(**(base | kw)))


@pytest.mark.parametrize("kw,problem", [
    (dict(groups=3), "groups = 3 does not divide the 16 experts"),
    (dict(groups=1), "groups = 1 is not a multiple of nodes = 2"),
    (dict(ranks_per_node=0), "groups = 4 needs hello.job.ranks_per_node"),
    (dict(world_size=0, experts=0), "needs hello.job.experts, hello.job.world_size"),
    (dict(ranks_per_node=3), "ranks_per_node = 3 does not divide world_size = 4"),
    (dict(groups=-1), "must be in 0..65536, got -1"),
])
def test_groups_that_do_not_fit_the_job_are_refused_naming_job_groups(kw, problem):
    with pytest.raises(WireError) as info:
        hello_record(spec(**kw), 1.0)
    assert info.value.field == "hello.job.groups"
    assert problem in info.value.problem


def test_a_spec_with_groups_that_fit_is_recorded():
    assert hello_record(spec(), 1.0).job.groups == K
    assert hello_record(spec(groups=0), 1.0).job.groups is None


def test_decide_with_groups_and_a_move_budget_holds_naming_groups():
    from moeplane.controlplane.controller.decide import Action, decide, ema
    from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy

    window = np.stack([skewed(s) for s in range(6)]).astype(np.float64)
    ident = np.tile(np.arange(G * S) % E, (L, 1))
    common = dict(recent_balancedness=np.full(6, 2.0), predicted=ema(window), current=ident,
                  world_size=G, slots_per_rank=S, nodes=2, step_time_s=1.0, now=100.0,
                  last_plan_at=None, window=window, groups=K)
    d = decide(policy=RebalancePolicy(max_moves=4), **common)
    assert d.action == Action.HOLD and "groups = 4" in d.reason and "max_moves" in d.reason
    d = decide(policy=RebalancePolicy(), **common)
    assert d.action == Action.REBALANCE, d.reason
    assert all(len(n) == 1 for row in nodes_of_groups(d.phy2log) for n in row)
