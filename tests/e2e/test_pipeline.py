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
                "agent", "--node-id", f"node-{i}", "--server", serve.info["grpc"], "--collector", "sim",
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
    serve = start_serve(tmp, database_url, redis_url)
    agents, sim = start_job(tmp, serve, steps=20)
    api = httpx.Client(base_url=serve.info["http"] + "/api/v1", timeout=10)
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
    api = httpx.Client(base_url=serve.info["http"] + "/api/v1", timeout=10)
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


def test_control_plane_killed_mid_stream_loses_and_doubles_nothing(tmp_path):
    db = f"sqlite:///{tmp_path / 'k.sqlite'}"
    serve = start_serve(tmp_path, db)
    agents, sim = start_job(tmp_path, serve, steps=40, step_time=0.1)
    api = httpx.Client(base_url=serve.info["http"] + "/api/v1", timeout=10)
    try:
        wait_until(lambda: (api.get("/jobs/e2e").json().get("latest_step") or 0) >= 8, 60, "some steps")
        serve.stop(signal.SIGKILL)  # connections drop mid-stream; agents spool and resend
        grpc_port = serve.info["grpc_port"]
        serve = start_serve(tmp_path, db, name="serve-2", extra=[])
        # the agents know the old address: restart on the same gRPC port
        serve.stop()
        serve = spawn_on_port(tmp_path, db, grpc_port)
        api = httpx.Client(base_url=serve.info["http"] + "/api/v1", timeout=10)
        assert sim.popen.wait(180) == 0, sim.output()
        wait_until(lambda: len(api.get("/jobs/e2e/loads", params={"step_end": 40}).json()) == 40
                   and all(s["nodes_reported"] == NODES for s in api.get("/jobs/e2e/loads", params={"step_end": 40}).json()),
                   60, "every step from every node after the restart")
        for s in api.get("/jobs/e2e/loads", params={"step_end": 40}).json():
            np.testing.assert_array_equal(np.sum(s["counts"], axis=1), NODES * GPN * TOKENS * TOP_K)
    finally:
        api.close()
        for p in [sim, *agents, serve]:
            p.stop()


def spawn_on_port(tmp, db, grpc_port):
    from tests.conftest import free_port

    http_port = free_port()
    proc = spawn("serve-3", ["serve", "--database-url", db, "--http-port", str(http_port),
                             "--grpc-listen", f"127.0.0.1:{grpc_port}"], tmp)
    proc.info = {"http": f"http://127.0.0.1:{http_port}", "grpc_port": grpc_port, "grpc": f"127.0.0.1:{grpc_port}"}
    wait_until(lambda: httpx.get(proc.info["http"] + "/api/v1/health", timeout=2).status_code == 200, 60, "serve-3")
    return proc
