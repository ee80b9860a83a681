"""The memory-offload loop end to end with real processes: ``moeplane serve`` (SQLite),
``moeplane agent`` and a CPU torch rank using the SDK. Profiles reach REST; a policy whose
watermark the rank is over makes a decision, which is pushed, applied in the rank, and reported
with the measured bytes stored beside the prediction."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.procs import Proc, spawn, start_serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.torch]
JOB, DEVICE = "mem", "node-0/gpu0"


def test_profiles_decision_apply_and_measured_report(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 'mem.sqlite'}")
    procs: list[Proc] = [serve]
    api = httpx.Client(base_url=serve.http + f"/api/v1/jobs/{JOB}", timeout=10)
    try:
        sock = tmp_path / "agent.sock"
        procs.append(spawn("agent", [
            "agent", "--node-id", "node-0", "--server", serve.grpc, "--collector", "sim",
            "--devices", "1", "--job-id", JOB, "--ranks", "0", "--local-socket", str(sock),
            "--spool-dir", str(tmp_path / "spool"), "--interval", "0.5",
            "--memory-interval", "0.2"], tmp_path))
        wait_until(sock.exists, 20, "the agent's socket")
        log = open(tmp_path / "rank.log", "wb")  # noqa: SIM115 - closed with the process
        rank = Proc("rank", subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.memory_rank", str(sock), DEVICE, JOB],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True), tmp_path / "rank.log")
        procs.append(rank)

        def profile():
            rows = api.get("/memory", params={"layers": True}).json()
            return isinstance(rows, list) and [r for r in rows if r["device_id"] == DEVICE
                                               and r.get("layers")]

        [before] = wait_until(profile, 20, "the rank's memory profile in REST")
        assert [x["name"] for x in before["layers"]] == [f"layers.{i}" for i in range(4)]
        assert all(x["activation_bytes"] > 0 and x["forward_s"] > 0 for x in before["layers"])
        assert before["applied_actions"] == [] and before["host_free_bytes"] > 0
        # a high watermark the rank is over by one layer's activations: the engine must act
        used, capacity = before["used_bytes"], before["capacity_bytes"]
        high = (used - before["layers"][0]["activation_bytes"]) / capacity
        r = api.put("/offload/policy", json={"high_watermark": high, "low_watermark": high / 2,
                                             "mode": "auto"})
        assert r.status_code == 200, r.text

        def applied():
            rows = api.get("/offload/decisions").json()
            return [d for d in rows if d["status"] in ("applied", "failed")]

        [decision] = wait_until(applied, 20, "a decision applied in the rank")
        detail = api.get(f"/offload/decisions/{decision['decision_id']}").json()
        assert detail["status"] == "applied", detail
        assert detail["actions"] and detail["device_id"] == DEVICE
        statuses = [e["status"] for e in detail["events"]]
        for s in ("proposed", "approved", "pushed", "node_received", "node_applied", "applied"):
            assert s in statuses, statuses
        # measured beside the prediction: the rank saved memory and ended under the watermark
        assert detail["measured_saved_bytes"] > 0
        assert detail["measured_used_bytes"] < used
        assert detail["measured_used_bytes"] <= detail["high_watermark_bytes"]
        assert detail["predicted_peak_bytes"] <= detail["high_watermark_bytes"]
        pairs = sorted(f"{a['kind']}:{layer}" for a in detail["actions"] for layer in a["layers"])
        wait_until(lambda: sorted((profile() or [{}])[0].get("applied_actions", [])) == pairs,
                   20, "the next profile to show the applied actions")
        assert rank.popen.poll() is None, rank.output()
    finally:
        api.close()
        codes = {p.name: p.stop() for p in reversed(procs)}
    assert codes["rank"] == 0 and codes["agent"] == 0, codes
