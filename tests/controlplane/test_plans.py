"""Plan lifecycle end to end over real gRPC and HTTP: auto and manual policies, reports,
measured balancedness, approval errors, rollback."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, loads
from tests.controlplane.serverthread import running_server

L, E, G, S = 4, 16, 4, 4


def job_hello(node: str, ranks: list[int]) -> pb.AgentMessage:
    msg = hello(node, devices=2, layers=L, experts=E)
    msg.hello.ranks[:] = ranks
    msg.hello.job.world_size = G
    msg.hello.job.slots_per_rank = S
    msg.hello.job.ranks_per_node = 2
    return msg


def skewed(step: int) -> np.ndarray:
    rng = np.random.default_rng(step)
    c = rng.integers(50, 150, size=(L, E))
    c[:, :4] *= 4  # experts 0..3 live on rank 0 under the identity placement
    return c


def poll(fn, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def report(seq, epoch, state, step, job="job-1"):
    return pb.AgentMessage(seq=seq, plan_report=pb.PlanReport(job_id=job, epoch=epoch, state=state, step=step))


def plans_of(agent):
    return [m.plan for m in agent.received if m.WhichOneof("body") == "plan"]


@pytest.fixture
def cluster(database_url):
    with running_server(database_url, controller_interval_s=0.05) as srv:
        http = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=10)
        a0, a1 = ScriptedAgent(srv["grpc_port"], "node-0"), ScriptedAgent(srv["grpc_port"], "node-1")
        aio.run(a0.__aenter__())
        aio.run(a1.__aenter__())
        a0.send(job_hello("node-0", [0, 1]))
        a1.send(job_hello("node-1", [2, 3]))
        aio.run(a1.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r)))
        aio.run(a0.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r)))
        yield srv, http, a0, a1
        aio.run(a0.__aexit__(None, None, None))
        aio.run(a1.__aexit__(None, None, None))
        http.close()


def send_steps(a0, a1, steps, seq0):
    seqs = []
    for i, step in enumerate(steps):
        c = skewed(step)
        half = c // 2
        a0.send(loads(seq0 + i, step, half, ts=1000.0 + step))
        a1.send(loads(seq0 + i, step, c - half, ts=1000.0 + step))
        seqs.append(seq0 + i)
    aio.run(a0.wait_acks(seqs))
    aio.run(a1.wait_acks(seqs))


def test_auto_policy_plans_pushes_applies_and_measures(cluster):
    srv, http, a0, a1 = cluster
    send_steps(a0, a1, range(5), seq0=1)
    aio.run(a0.wait_for(lambda _r: plans_of(a0), timeout=20))
    aio.run(a1.wait_for(lambda _r: plans_of(a1), timeout=20))
    p0, p1 = plans_of(a0)[0], plans_of(a1)[0]
    assert p0.epoch == p1.epoch == 1 and p0.phy2log.data == p1.phy2log.data
    assert http.get("/jobs/job-1/plans/1").json()["status"] == "pushed"
    a0.send(report(100, 1, pb.PLAN_STATE_APPLIED, 6))
    aio.run(a0.wait_acks([100]))
    assert http.get("/jobs/job-1/plans/1").json()["status"] == "pushed"  # node-1 not yet
    a1.send(report(100, 1, pb.PLAN_STATE_APPLIED, 6))
    aio.run(a1.wait_acks([100]))
    plan = http.get("/jobs/job-1/plans/1").json()
    assert plan["status"] == "applied" and plan["applied_step"] == 6
    send_steps(a0, a1, [7], seq0=101)
    plan = poll(lambda: (p := http.get("/jobs/job-1/plans/1").json())["measured_after"] and p, what="measurement")
    assert plan["measured_after"] < plan["measured_before"]
    assert abs(plan["measured_after"] - plan["predicted_after"]) < 0.25
    assert [e["status"] for e in plan["events"]][:3] == ["proposed", "approved", "pushed"]


def test_manual_policy_waits_for_approval_and_guards_transitions(cluster):
    srv, http, a0, a1 = cluster
    r = http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    assert r.status_code == 200 and r.json()["mode"] == "manual"
    assert http.put("/jobs/job-1/policy", json={"mode": "sometimes"}).status_code == 422
    send_steps(a0, a1, range(5), seq0=1)
    proposed = poll(lambda: http.get("/jobs/job-1/plans", params={"status": "proposed"}).json(), what="proposal")
    epoch = proposed[0]["epoch"]
    assert plans_of(a0) == [] and plans_of(a1) == []  # nothing is pushed without a human
    assert http.post(f"/jobs/job-1/plans/{epoch}/approve").json()["status"] == "pushed"
    aio.run(a0.wait_for(lambda _r: plans_of(a0)))
    assert http.post(f"/jobs/job-1/plans/{epoch}/approve").status_code == 409
    assert http.post(f"/jobs/job-1/plans/{epoch}/reject").status_code == 409
    assert http.post("/jobs/job-1/plans/99/approve").status_code == 404
    assert http.post("/jobs/job-1/rollback", json={"epoch": 42}).status_code == 404
    assert http.post("/jobs/job-1/rollback", json={"epoch": -1}).status_code == 422
    # reports: unknown epoch, wrong job / node outside the job → rejected, nothing applied
    a0.send(report(200, 77, pb.PLAN_STATE_APPLIED, 9))
    a0.send(report(201, epoch, pb.PLAN_STATE_APPLIED, 9, job="other-job"))
    acks = aio.run(a0.wait_acks([200, 201]))
    assert acks[200].code == 3 and "plan 77" in acks[200].message
    assert acks[201].code in (3, 7)
    assert http.get(f"/jobs/job-1/plans/{epoch}").json()["status"] == "pushed"


def test_superseded_plan_cannot_be_approved_and_rollback_restores(cluster):
    srv, http, a0, a1 = cluster
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 0})
    send_steps(a0, a1, range(5), seq0=1)
    first = poll(lambda: http.get("/jobs/job-1/plans", params={"status": "proposed"}).json(), what="proposal")[0]
    send_steps(a0, a1, range(5, 8), seq0=10)
    poll(lambda: http.get(f"/jobs/job-1/plans/{first['epoch']}").json()["status"] == "superseded", what="supersede")
    assert http.post(f"/jobs/job-1/plans/{first['epoch']}/approve").status_code == 409
    latest = poll(lambda: http.get("/jobs/job-1/plans", params={"status": "proposed"}).json(), what="2nd")[0]
    http.put("/jobs/job-1/policy", json={"min_interval_s": 3600})
    assert http.post(f"/jobs/job-1/plans/{latest['epoch']}/approve").status_code == 200
    for a in (a0, a1):
        a.send(report(500, latest["epoch"], pb.PLAN_STATE_APPLIED, 20))
        aio.run(a.wait_acks([500]))
    assert http.get(f"/jobs/job-1/plans/{latest['epoch']}").json()["status"] == "applied"
    rb = http.post("/jobs/job-1/rollback", json={"epoch": 0})
    assert rb.status_code == 200 and rb.json()["kind"] == "rollback"
    for a in (a0, a1):
        a.send(report(501, rb.json()["epoch"], pb.PLAN_STATE_APPLIED, 30))
        aio.run(a.wait_acks([501]))
    assert http.get(f"/jobs/job-1/plans/{latest['epoch']}").json()["status"] == "rolled_back"
    epochs = [p["epoch"] for p in http.get("/jobs/job-1/plans").json()]
    assert len(epochs) == len(set(epochs)) and epochs == sorted(epochs, reverse=True)


def test_dry_run(cluster):
    srv, http, a0, a1 = cluster
    send_steps(a0, a1, range(2), seq0=1)
    r = http.post("/jobs/job-1/plans/dry-run", json={"steps": 2})
    assert r.status_code == 200, r.text
    assert r.json()["balancedness_after"] < r.json()["balancedness_before"]
    assert http.post("/jobs/job-1/plans/dry-run", json={"loads": [[1.0, 2.0]]}).status_code == 422
