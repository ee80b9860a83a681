"""Plan lifecycle end to end over real gRPC and HTTP: auto and manual policies, reports,
measured balancedness, approval errors, rollback."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from moeplane.controlplane.balancing import identity_placement
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, loads
from tests.controlplane.serverthread import running_server
from tests.procs import wait_until as poll

L, E, G, S = 4, 16, 4, 4
IDENT = identity_placement(L, E, G * S)  # [L, G*S]: slot s holds expert s % E


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
        a1.send(loads(seq0 + i, step, c - half, ts=1000.0 + step, ranks=(2, 3)))
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
    send_steps(a0, a1, range(7, 17), seq0=101)  # measured over its first 10 steps
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
    repair = http.post("/jobs/job-1/plans/dry-run", json={"steps": 2, "search": "repair"})
    assert repair.status_code == 200, repair.text
    assert repair.json()["balancedness_after"] < repair.json()["balancedness_before"]
    assert http.post("/jobs/job-1/plans/dry-run", json={"loads": [[1.0, 2.0]]}).status_code == 422
    bad = http.post("/jobs/job-1/plans/dry-run", json={"steps": 2, "search": "fast"})
    assert bad.status_code == 422 and "search" in bad.text


def identity_with_swaps(base: np.ndarray, swaps: list[tuple[int, int, int]]) -> np.ndarray:
    """``base [L, G*S]`` with slots a and b of layer l exchanged for each (l, a, b)."""
    out = base.copy()
    for layer, a, b in swaps:
        out[layer, [a, b]] = out[layer, [b, a]]
    return out


def apply_all(agents, epoch: int, seq: int) -> None:
    for a in agents:
        a.send(report(seq, epoch, pb.PLAN_STATE_APPLIED, seq))
        assert aio.run(a.wait_acks([seq]))[seq].code == 0


def test_operator_placement_is_validated(cluster):
    srv, http, a0, a1 = cluster
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    send_steps(a0, a1, [0], seq0=1)
    bad = {
        "shape": (IDENT[:, :-1].tolist(), "must have shape [layers, gpus*slots_per_gpu] = [4, 16]"),
        "ids": ((IDENT + E).tolist(), "outside [0, 16)"),
        "missing": (np.where(IDENT == 3, 4, IDENT).tolist(), "expert 3 of layer 0 without a replica"),
        "ragged": ([list(range(16)), list(range(15))] + IDENT[2:].tolist(), "rows have different lengths"),
        "huge": ([[2**70] + list(range(1, 16))] + IDENT[1:].tolist(), "int64 range"),
    }
    for name, (rows, needle) in bad.items():
        r = http.post("/jobs/job-1/plans", json={"phy2log": rows})
        assert r.status_code == 422 and needle in r.text, (name, r.text)
    for rows in ([["1"] * 16] * 4, [[1.5] * 16] * 4, [[True] * 16] * 4):
        assert http.post("/jobs/job-1/plans", json={"phy2log": rows}).status_code == 422
    assert http.post("/jobs/nope/plans", json={"phy2log": IDENT.tolist()}).status_code == 404
    assert http.get("/jobs/job-1/plans", params={"status": "pushed"}).json() == []
    assert plans_of(a0) == []


def test_operator_plans_go_full_then_as_deltas_and_full_again_after_reconnect_or_failure(cluster):
    from moeplane.controlplane.wire.plan_codec import PlanReceiver

    srv, http, a0, a1 = cluster
    sent = srv["ingest"].plans.sent
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    send_steps(a0, a1, [0], seq0=1)
    rx = {a.node_id: PlanReceiver() for a in (a0, a1)}

    def push(phy2log, agents, n_plans):
        r = http.post("/jobs/job-1/plans", json={"phy2log": phy2log.tolist(), "reason": "test"})
        assert r.status_code == 200, r.text
        assert (r.json()["kind"], r.json()["status"], r.json()["reason"]) == ("operator", "pushed", "test")
        got = []
        for a in agents:
            aio.run(a.wait_for(lambda _r, a=a: len(plans_of(a)) >= n_plans))
            plan = plans_of(a)[-1]
            assert plan.epoch == r.json()["epoch"]
            np.testing.assert_array_equal(rx[a.node_id].receive(plan), phy2log)
            got.append(plan)
        return r.json()["epoch"], got

    p1 = identity_with_swaps(IDENT, [(0, 0, 5), (3, 1, 14)])
    e1, (f0, f1) = push(p1, (a0, a1), 1)
    assert f0.base_epoch == f1.base_epoch == 0 and f0.phy2log.dtype == "uint8"
    assert r_moves(http, e1) > 0
    assert http.post("/jobs/job-1/plans", json={"phy2log": p1.tolist()}).status_code == 409  # in flight
    apply_all((a0, a1), e1, 10)

    p2 = identity_with_swaps(p1, [(1, 2, 9)])
    e2, (d0, d1) = push(p2, (a0, a1), 2)
    for d in (d0, d1):
        assert (d.base_epoch, d.HasField("phy2log")) == (e1, False)
        assert decode_array(d.changed_slots, "s", kinds="iu").tolist() == [G * S + 2, G * S + 9]
        assert decode_array(d.changed_experts, "e", kinds="iu").tolist() == [9, 2]
    assert sent["delta"] == 2
    # one bus subscription per channel for both streams (with Redis each is a connection)
    assert len(srv["bus"]._subs["plans.job-1"]) == len(srv["bus"]._subs["offload.job-1"]) == 1
    apply_all((a0, a1), e2, 11)

    # node-0 reconnects: a new stream starts with the running plan in full, then deltas again
    aio.run(a0.__aexit__(None, None, None))
    b0 = ScriptedAgent(srv["grpc_port"], "node-0")
    aio.run(b0.__aenter__())
    b0.send(job_hello("node-0", [0, 1]))
    aio.run(b0.wait_for(lambda _r: plans_of(b0)))
    running = plans_of(b0)[0]
    assert (running.epoch, running.base_epoch) == (e2, 0)
    rx["node-0"] = PlanReceiver()
    np.testing.assert_array_equal(rx["node-0"].receive(running), p2)
    p3 = identity_with_swaps(p2, [(2, 4, 7)])
    e3, (d0, d1) = push(p3, (b0, a1), 2)
    assert d0.base_epoch == d1.base_epoch == e2
    # a FAILED report (e.g. a delta the agent could not rebuild): that stream's next plan is full
    a1.send(report(12, e3, pb.PLAN_STATE_FAILED, 12))
    aio.run(a1.wait_acks([12]))
    assert http.get(f"/jobs/job-1/plans/{e3}").json()["status"] == "failed"
    p4 = identity_with_swaps(p3, [(0, 6, 8)])
    _e4, (d0, f1) = push(p4, (b0, a1), 3)
    assert d0.base_epoch == e3 and f1.base_epoch == 0 and f1.HasField("phy2log")
    aio.run(b0.__aexit__(None, None, None))


def r_moves(http, epoch: int) -> int:
    return http.get(f"/jobs/job-1/plans/{epoch}").json()["moves"]


def test_applied_only_when_every_node_now_in_the_job_reported(cluster):
    """The per-report check counts first; a node that reported and then left the job must not
    stand in for one that has not reported."""
    import sqlalchemy as sa

    from moeplane.controlplane.store import tables as t

    srv, http, a0, a1 = cluster
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    r = http.post("/jobs/job-1/plans", json={"phy2log": identity_with_swaps(IDENT, [(0, 1, 2)]).tolist()})
    epoch = r.json()["epoch"]
    a0.send(report(20, epoch, pb.PLAN_STATE_APPLIED, 3))
    aio.run(a0.wait_acks([20]))
    with srv["engine"].begin() as conn:  # node-0 moves to another job after reporting
        conn.execute(sa.update(t.nodes).where(t.nodes.c.node_id == "node-0").values(job_id="job-2"))
    with srv["engine"].begin() as conn:  # a second node of the job that has not reported
        conn.execute(sa.insert(t.nodes).values(node_id="node-9", job_id="job-1", first_seen=0, last_seen=0))
    a1.send(report(20, epoch, pb.PLAN_STATE_APPLIED, 3))
    aio.run(a1.wait_acks([20]))
    assert http.get(f"/jobs/job-1/plans/{epoch}").json()["status"] == "pushed"  # node-9 missing
    with srv["engine"].begin() as conn:
        conn.execute(sa.delete(t.nodes).where(t.nodes.c.node_id == "node-9"))
    a1.send(report(21, epoch, pb.PLAN_STATE_APPLIED, 3))
    aio.run(a1.wait_acks([21]))
    assert http.get(f"/jobs/job-1/plans/{epoch}").json()["status"] == "applied"


def test_a_malformed_plan_on_the_bus_does_not_stop_the_job_subscription(cluster):
    srv, http, a0, a1 = cluster
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    send_steps(a0, a1, [0], seq0=1)
    aio.run(srv["bus"].publish("plans.job-1", b"\xff\xff not a PlacementPlan"))
    r = http.post("/jobs/job-1/plans", json={"phy2log": identity_with_swaps(IDENT, [(2, 0, 3)]).tolist()})
    assert r.status_code == 200, r.text
    for a in (a0, a1):
        aio.run(a.wait_for(lambda _r, a=a: plans_of(a)))
        assert [p.epoch for p in plans_of(a)] == [r.json()["epoch"]]


def test_config_comes_first_even_when_a_plan_is_published_while_the_stream_subscribes(cluster):
    """The agent must read Config first on a new stream. A plan committed while the stream is
    still subscribing to its job's channels (here: between the plans and the offload
    subscription) reaches it after the Config, not before."""
    import asyncio

    from moeplane.controlplane.wire.plan_codec import full_plan

    srv, _http, _a0, _a1 = cluster
    svc, bus = srv["ingest"], srv["bus"]
    plan = full_plan("job-1", 99, IDENT, S, 0).SerializeToString()
    follow = svc.channels.follow

    async def follow_while_a_plan_is_published(channel, key, deliver):
        if channel.startswith("offload."):  # plans.job-1 is live for this stream by now
            await bus.publish("plans.job-1", plan)
            for _ in range(1000):  # yield until it reached this stream's queue (or Config did)
                if not key.out.empty():
                    break
                await asyncio.sleep(0)
        await follow(channel, key, deliver)

    svc.channels.follow = follow_while_a_plan_is_published
    b = ScriptedAgent(srv["grpc_port"], "node-2")
    try:
        aio.run(b.__aenter__())
        b.send(job_hello("node-2", [4, 5]))
        aio.run(b.wait_for(lambda r: len(r) >= 2))
        assert [m.WhichOneof("body") for m in b.received[:2]] == ["config", "plan"]
        assert b.received[1].plan.epoch == 99
    finally:
        svc.channels.follow = follow
        aio.run(b.__aexit__(None, None, None))


def test_agents_connecting_at_once_read_the_running_placement_once(cluster, monkeypatch):
    """A reconnect storm (e.g. after a control-plane restart) must not read the [L, G*S]
    placement blob once per agent: one read, shared by every stream."""
    from moeplane.controlplane.ingest import planpush

    srv, http, a0, a1 = cluster
    http.put("/jobs/job-1/policy", json={"mode": "manual", "min_interval_s": 3600})
    placement = identity_with_swaps(IDENT, [(0, 0, 5)])
    r = http.post("/jobs/job-1/plans", json={"phy2log": placement.tolist()})
    assert r.status_code == 200, r.text
    for a in (a0, a1):  # the replica has forwarded it (and cached it) ...
        aio.run(a.wait_for(lambda _r, a=a: plans_of(a)))
    srv["ingest"].plans._jobs.clear()  # ... and forgets it, as after a restart
    reads = []
    real = planpush.plans.get_plan
    monkeypatch.setattr(planpush.plans, "get_plan", lambda *a, **k: reads.append(a[2]) or real(*a, **k))
    agents = [ScriptedAgent(srv["grpc_port"], f"node-{i}") for i in (5, 6, 7)]
    for a in agents:
        aio.run(a.__aenter__())
    try:
        for i, a in enumerate(agents):  # all three hellos in flight at once
            a.send(job_hello(f"node-{5 + i}", [10 + 2 * i, 11 + 2 * i]))
        for a in agents:
            aio.run(a.wait_for(lambda _r, a=a: plans_of(a)))
            np.testing.assert_array_equal(decode_array(plans_of(a)[0].phy2log, "p", kinds="iu"), placement)
        assert reads == [r.json()["epoch"]]
        assert srv["ingest"].plans._loading == {}  # each stream's load ended before it sent the plan
    finally:
        for a in agents:
            aio.run(a.__aexit__(None, None, None))


def test_plan_loads_drop_the_jobs_lock_once_nobody_holds_or_waits_on_it(monkeypatch):
    """PlanCache.load keeps a job's lock only while loads of that job run or wait (it used to
    keep one per job forever); concurrent loads still read the plan once, and a cancelled
    waiter or a failed read leaves nothing behind."""
    import asyncio
    import threading

    from moeplane.controlplane.ingest import planpush
    from moeplane.controlplane.store.queries import NotFound

    cache = planpush.PlanCache(channels=None)
    entered, gate = threading.Event(), threading.Event()
    reads = []

    def get_plan(_engine, job_id, epoch, **_kw):
        reads.append((job_id, epoch))
        if job_id == "gone":
            raise NotFound(f"plan {epoch} of job {job_id!r}")
        entered.set()
        assert gate.wait(10), "the test never opened the gate"
        return {"job_id": job_id, "epoch": epoch, "phy2log": IDENT, "slots_per_rank": S}

    monkeypatch.setattr(planpush.plans, "get_plan", get_plan)

    async def scenario():
        tasks = [asyncio.create_task(cache.load(None, "job-1", 7)) for _ in range(4)]
        assert await asyncio.to_thread(entered.wait, 10)  # the first load reads; the others queue
        assert list(cache._loading) == ["job-1"] and cache._loading["job-1"].users == 4
        tasks[-1].cancel()  # a stream gone while it waited
        gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[-1], asyncio.CancelledError)
        assert all(p is done[0] for p in done[:3]) and done[0].epoch == 7
        assert cache._loading == {}
        assert await cache.load(None, "job-1", 7) is done[0]  # held: no read, no lock left
        assert cache._loading == {}
        with pytest.raises(NotFound):
            await cache.load(None, "gone", 3)
        assert cache._loading == {}

    aio.run(scenario(), timeout=30)
    assert reads == [("job-1", 7), ("gone", 3)]
