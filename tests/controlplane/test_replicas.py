"""Two control-plane processes on real PostgreSQL and Redis share the agents: a plan made by
the leader reaches agents on both replicas; killing the leader hands the job to the other
within 5 s; no epoch is used twice."""

from __future__ import annotations

import signal
import time

import httpx
import pytest
import sqlalchemy as sa

from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, loads
from tests.controlplane.test_plans import job_hello, plans_of, report, skewed
from tests.procs import start_serve, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def lease(engine, job):
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT term, holder FROM job_leases WHERE job_id = :j"), {"j": job}).first()


def test_two_replicas_share_agents_and_fail_over(tmp_path, pg_url, redis_url):
    r1 = start_serve(tmp_path, pg_url, redis_url=redis_url, name="replica-1")
    r2 = start_serve(tmp_path, pg_url, redis_url=redis_url, name="replica-2")
    engine = make_engine(pg_url)
    agents = []
    try:
        a0 = ScriptedAgent(r1.grpc_port, "node-0")
        a1 = ScriptedAgent(r2.grpc_port, "node-1")
        for a, ranks in ((a0, [0, 1]), (a1, [2, 3])):
            aio.run(a.__aenter__())
            agents.append(a)
            a.send(job_hello(a.node_id, ranks))
            aio.run(a.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r)))
        http = httpx.Client(base_url=r1.http + "/api/v1", timeout=10)
        http.put("/jobs/job-1/policy", json={"min_interval_s": 0})
        for step in range(5):
            c = skewed(step)
            a0.send(loads(step + 1, step, c // 2, ts=100.0 + step))
            a1.send(loads(step + 1, step, c - c // 2, ts=100.0 + step, ranks=(2, 3)))
        aio.run(a0.wait_for(lambda _r: plans_of(a0), timeout=30))
        aio.run(a1.wait_for(lambda _r: plans_of(a1), timeout=30))
        assert plans_of(a0)[0].SerializeToString() == plans_of(a1)[0].SerializeToString()
        term, holder = lease(engine, "job-1")
        pid = int(holder.rsplit(":", 1)[1])
        leader, follower = (r1, r2) if pid == r1.popen.pid else (r2, r1)
        assert pid == leader.popen.pid

        # kill the leader's process; the other replica must lead within 5 s
        killed_at = time.monotonic()
        leader.stop(signal.SIGKILL)
        wait_until(lambda: lease(engine, "job-1")[1].endswith(f":{follower.popen.pid}"), 10, "takeover")
        takeover_s = time.monotonic() - killed_at
        assert takeover_s <= 5.0, f"takeover took {takeover_s:.1f}s"
        assert lease(engine, "job-1")[0] > term

        # agents reconnect to the survivor; the plan is applied; a rollback then re-plan works
        for a in agents:
            aio.run(a.__aexit__(None, None, None))
        agents.clear()
        b0 = ScriptedAgent(follower.grpc_port, "node-0")
        b1 = ScriptedAgent(follower.grpc_port, "node-1")
        for b, ranks in ((b0, [0, 1]), (b1, [2, 3])):
            aio.run(b.__aenter__())
            agents.append(b)
            b.send(job_hello(b.node_id, ranks))
            aio.run(b.wait_for(lambda _r, b=b: plans_of(b)))  # the running plan is re-sent
            b.send(report(50, 1, pb.PLAN_STATE_APPLIED, 6))
            aio.run(b.wait_acks([50]))
        http2 = httpx.Client(base_url=follower.http + "/api/v1", timeout=10)
        assert http2.get("/jobs/job-1/plans/1").json()["status"] == "applied"
        rb = http2.post("/jobs/job-1/rollback", json={"epoch": 0}).json()
        for b in agents:
            b.send(report(51, rb["epoch"], pb.PLAN_STATE_APPLIED, 8))
            aio.run(b.wait_acks([51]))
        for step in range(9, 14):
            c = skewed(step)
            b0.send(loads(100 + step, step, c // 2, ts=200.0 + step))
            b1.send(loads(100 + step, step, c - c // 2, ts=200.0 + step, ranks=(2, 3)))
        wait_until(lambda: len(http2.get("/jobs/job-1/plans").json()) >= 3, 30, "a plan from the new leader")
        epochs = [p["epoch"] for p in http2.get("/jobs/job-1/plans").json()]
        assert sorted(epochs) == list(range(1, len(epochs) + 1))
        with engine.connect() as conn:
            terms = conn.execute(sa.text("SELECT leader_term FROM plans WHERE job_id='job-1' AND kind='rebalance'")).scalars().all()
        assert max(terms) > min(terms)  # plans made under both leaders
    finally:
        for a in agents:
            aio.run(a.__aexit__(None, None, None))
        r1.stop()
        r2.stop()
        engine.dispose()
