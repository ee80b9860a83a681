"""End to end with real processes: ``moeplane serve``, two ``moeplane agent`` and a
``moeplane simulate`` job; data read back through REST. Once on SQLite with the in-process
bus, once on PostgreSQL with Redis."""

from __future__ import annotations

import signal

import httpx
import numpy as np
import pytest

from tests.procs import spawn, start_serve, wait_until

NODES, GPN, L, E, TOP_K, TOKENS = 2, 4, 4, 16, 2, 256
pytestmark = pytest.mark.slow


def start_job(tmp, serve, steps: int, step_time: float = 0.1, job: str = "e2e"):
    agents = []
    for i in range(NODES):
        agents.append(
            spawn(f"agent-{i}", [
                "agent", "--node-id", f"node-{i}", "--server", serve.grpc, "--collector", "sim",
                "--devices", str(GPN), "--job-id", job, "--ranks", f"{i * GPN}-{(i + 1) * GPN - 1}",
                "--local-socket", str(tmp / f"a{i}.sock"), "--spool-dir", str(tmp / f"spool{i}"),
                "--interval", "0.2",
            ], tmp)
        )
    sim = spawn("simulate", [
        "simulate", "--job-id", job, "--nodes", str(NODES), "--gpus-per-node", str(GPN),
        "--layers", str(L), "--experts", str(E), "--top-k", str(TOP_K), "--tokens-per-step", str(TOKENS),
        "--step-time", str(step_time), "--steps", str(steps), "--agent-socket-template", str(tmp / "a{i}.sock"),
    ], tmp)
    return agents, sim


def check_pipeline(tmp, database_url, redis_url=""):
    serve = start_serve(tmp, database_url, redis_url=redis_url)
    agents, sim = start_job(tmp, serve, steps=20)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        assert sim.popen.wait(120) == 0, sim.output()
        wait_until(lambda: (api.get("/jobs/e2e").json().get("latest_step") or 0) >= 19, 30, "all steps stored")
        job = api.get("/jobs/e2e").json()
        assert (job["layers"], job["experts"], job["world_size"]) == (L, E, NODES * GPN)
        devices = api.get("/devices", params={"job_id": "e2e"}).json()
        assert len(devices) == NODES * GPN
        latest = api.get("/devices/latest", params={"job_id": "e2e"}).json()
        assert {d["device_id"] for d in latest} == {d["device_id"] for d in devices}
        assert all(0 <= d["metrics"]["utilization_ratio"] <= 1 for d in latest)
        hist = api.get(f"/devices/{devices[0]['device_id']}/samples", params={"metric": "memory_used_bytes"}).json()
        assert len(hist) >= 2
        wait_until(lambda: all(s["nodes_reported"] == NODES for s in api.get("/jobs/e2e/loads", params={"step_end": 20}).json()),
                   30, "both nodes in every step")
        steps = api.get("/jobs/e2e/loads", params={"step_end": 20}).json()
        assert [s["step"] for s in steps] == list(range(20))
        for s in steps:  # every rank routes TOKENS * TOP_K per layer: nothing lost or doubled
            np.testing.assert_array_equal(np.sum(s["counts"], axis=1), NODES * GPN * TOKENS * TOP_K)
        stats = api.get("/jobs/e2e/steps", params={"step_start": 5, "step_end": 6}).json()
        assert sorted(r["rank"] for r in stats) == list(range(NODES * GPN))
        assert all(0 <= r["host_bound_ratio"] <= 1 for r in stats)
        # auto policy: plans were made, every rank applied at one step, balancedness improved
        plans = api.get("/jobs/e2e/plans").json()
        applied = [p for p in plans if p["status"] == "applied"]
        assert applied, plans
        events = api.get(f"/jobs/e2e/plans/{applied[-1]['epoch']}").json()["events"]
        node_steps = {e["node_id"]: e["step"] for e in events if e["status"] == "node_applied"}
        assert set(node_steps) == {f"node-{i}" for i in range(NODES)} and len(set(node_steps.values())) == 1
        measured = [p for p in applied if p["measured_after"] is not None]
        assert measured and all(p["measured_after"] < p["measured_before"] for p in measured)
    finally:
        api.close()
        for p in [sim, *agents, serve]:
            p.stop()


def test_pipeline_sqlite_in_process_bus(tmp_path):
    check_pipeline(tmp_path, f"sqlite:///{tmp_path / 'e2e.sqlite'}")


@pytest.mark.postgres
@pytest.mark.redis
def test_pipeline_postgres_redis(tmp_path, pg_url, redis_url):
    check_pipeline(tmp_path, pg_url, redis_url)


def test_manual_policy_changes_nothing_until_approved(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 'm.sqlite'}", extra=["--rebalance-mode", "manual"])
    agents, sim = start_job(tmp_path, serve, steps=0, step_time=0.1)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        def proposals():
            r = api.get("/jobs/e2e/plans", params={"status": "proposed"})
            return r.json() if r.status_code == 200 else []

        proposed = wait_until(proposals, 60, "a proposal")
        api.put("/jobs/e2e/policy", json={"min_interval_s": 3600})  # keep this proposal current
        r = api.get("/jobs/e2e/plans", params={"status": "proposed"})
        assert r.status_code == 200, (r.status_code, r.text, serve.output()[-3000:])
        epoch = r.json()[0]["epoch"]
        assert proposed and all(p["status"] in ("proposed", "superseded") for p in api.get("/jobs/e2e/plans").json())
        assert api.post(f"/jobs/e2e/plans/{epoch}/approve").status_code == 200
        wait_until(lambda: api.get(f"/jobs/e2e/plans/{epoch}").json()["status"] == "applied", 60, "applied")
    finally:
        api.close()
        for p in [sim, *agents, serve]:
            p.stop()


def spooled_samples(spool_dir) -> int:
    """Device-sample rounds an agent holds unacknowledged (read from its spool file)."""
    import sqlite3

    path = spool_dir / "spool.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
        return db.execute("SELECT count(*) FROM messages WHERE kind = 'samples'").fetchone()[0]


def test_control_plane_down_30s_mid_job_loses_and_doubles_nothing(tmp_path):
    """Issue 6: the control plane is killed for 30 s while a simulated job runs, then restarted:
    every step and every sample round arrives exactly once (counted in the database)."""
    import sqlalchemy as sa

    from moeplane.controlplane.store.engine import make_engine

    steps, interval = 400, 1.0  # the control plane tells agents to sample at 1 Hz
    db = f"sqlite:///{tmp_path / 'k.sqlite'}"
    serve = start_serve(tmp_path, db)
    agents, sim = start_job(tmp_path, serve, steps=steps, step_time=0.1)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        wait_until(lambda: (api.get("/jobs/e2e").json().get("latest_step") or 0) >= 8, 60, "some steps")
        serve.stop(signal.SIGKILL)  # connections drop mid-stream; agents keep sampling and spool
        api.close()
        # the outage lasts until every agent has spooled 30 s of sample rounds
        wait_until(lambda: all(spooled_samples(tmp_path / f"spool{i}") >= 30 / interval for i in range(NODES)),
                   120, "30 s of spooled samples on every agent", interval=0.5)
        assert sim.popen.poll() is None, "the job must still be running when the control plane returns"
        serve = spawn_on_port(tmp_path, db, serve.grpc_port)
        api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
        assert sim.popen.wait(300) == 0, sim.output()

        def complete():
            loads = api.get("/jobs/e2e/loads", params={"step_end": steps, "limit": steps}).json()
            return len(loads) == steps and all(s["nodes_reported"] == NODES for s in loads) and loads

        for s in wait_until(complete, 120, "every step from every node after the restart"):
            np.testing.assert_array_equal(np.sum(s["counts"], axis=1), NODES * GPN * TOKENS * TOP_K)
        wait_until(lambda: all(spooled_samples(tmp_path / f"spool{i}") == 0 for i in range(NODES)), 60, "spools drained")
        engine = make_engine(db)
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT l.node_id, f.ts FROM sample_frames f JOIN sample_layouts l ON l.id = f.layout"
            )).all()
            parts = conn.execute(sa.text("SELECT count(*) FROM load_parts WHERE job_id = 'e2e'")).scalar()
        engine.dispose()
        assert parts == steps * NODES
        for i in range(NODES):
            ts = sorted(t for n, t in rows if n == f"node-{i}")
            assert len(ts) == len(set(ts)), "a sample round stored twice"
            gaps = np.diff(ts)
            assert ts[-1] - ts[0] > 30 and gaps.max() < 5 * interval, f"samples missing: largest gap {gaps.max():.2f}s"
    finally:
        api.close()
        for p in [sim, *agents, serve]:
            p.stop()


def spawn_on_port(tmp, db, grpc_port):
    return start_serve(tmp, db, name="serve-3", grpc_port=grpc_port, timeout=60)
