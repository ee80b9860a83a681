"""``moeplane simulate --rl colocated`` through a real node agent process into the control plane:
the idle analysis over REST finds the simulated generation tail, and the MoE policy's expert
loads by phase show rollout routing less evenly than training."""

from __future__ import annotations

import httpx

from moeplane.controlplane.procs import spawn, wait_until
from tests.controlplane.serverthread import running_server


def test_simulated_colocated_rl_job_reaches_rest(tmp_path):
    with running_server(f"sqlite:///{tmp_path / 'sim.sqlite'}") as srv:
        agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", f"127.0.0.1:{srv['grpc_port']}",
                                "--collector", "sim", "--devices", "4", "--job-id", "grpo", "--ranks", "0-3",
                                "--local-socket", str(tmp_path / "node-0.sock"),
                                "--spool-dir", str(tmp_path / "spool")], tmp_path)
        sim = spawn("simulate", ["simulate", "--rl", "colocated", "--job-id", "grpo", "--nodes", "1",
                                 "--gpus-per-node", "4", "--steps", "4", "--step-time", "0.3",
                                 "--agent-socket-template", str(tmp_path / "{node}.sock")], tmp_path)
        try:
            assert sim.popen.wait(120) == 0, sim.output()
            api = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/grpo/rl", timeout=10)

            def analysed():
                r = api.get("/idle", params={"step_start": 0, "step_end": 4})
                return r.status_code == 200 and r.json()["steps"] == [0, 1, 2, 3] and r.json()

            got = wait_until(analysed, 60, "four analysed steps", retry_on=(OSError, httpx.HTTPError))
            assert got["ranks"] == [0, 1, 2, 3] and set(got["roles"]) == {"hybrid"}
            tail = got["summary"]["idle_by_cause_s"]["generation_tail"]
            assert tail > 0 and abs(tail - sum(map(sum, got["idle"]))) < 1e-6
            assert got["summary"]["switch_share"] > 0 and len(api.get("/batches").json()) == 4

            def loads():
                r = api.get("/loads", params={"step_start": 0, "step_end": 4}).json()
                return [p["rows"] for p in r.get("phases", [])] == [16, 16] and r

            by = {p["phase"]: p for p in wait_until(loads, 60, "phase loads of 4 ranks x 4 steps",
                                                    retry_on=(OSError, httpx.HTTPError))["phases"]}
            assert set(by) == {"generate", "train_update"}
            assert by["generate"]["max_over_mean_avg"] > 1.5 * by["train_update"]["max_over_mean_avg"]
        finally:
            sim.stop()
            agent.stop()
