"""The README's real training run: ``moeplane serve`` + ``moeplane agent`` + ``torchrun
--nproc-per-node 4 examples/train_moe.py`` on gloo. The control plane plans from the job's real
router counts and every rank applies the plan live."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from moeplane.controlplane.procs import free_port
from tests.procs import spawn, start_serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]


def test_training_job_is_rebalanced_live(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 't.sqlite'}")
    sock = tmp_path / "agent.sock"
    agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", serve.grpc, "--collector", "host",
                            "--job-id", "train-moe", "--ranks", "0-3", "--local-socket", str(sock),
                            "--spool-dir", str(tmp_path / "spool")], tmp_path)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        r = api.put("/default-policy", json={"min_interval_s": 2, "sustain_steps": 3})
        assert r.status_code == 200, r.text
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        assert torchrun, "torchrun not found beside the interpreter (make torch)"
        run = subprocess.run(
            [torchrun, "--nproc-per-node", "4", "--master-port", str(free_port()),
             str(ROOT / "examples" / "train_moe.py"), "--agent-socket", str(sock), "--steps", "30",
             "--job-id", "train-moe"],
            cwd=ROOT, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "PLAN_STATE_APPLIED" in run.stderr + run.stdout
        wait_until(lambda: (api.get("/jobs/train-moe").json().get("latest_step") or 0) >= 29, 30, "all steps stored")
        plans = api.get("/jobs/train-moe/plans").json()
        applied = [p for p in plans if p["status"] == "applied"]
        assert applied, plans
        job = api.get("/jobs/train-moe").json()
        assert (job["layers"], job["experts"], job["world_size"]) == (4, 16, 4)
        stats = api.get("/jobs/train-moe/steps", params={"step_start": 10, "step_end": 11}).json()
        assert sorted(s["rank"] for s in stats) == [0, 1, 2, 3]
    finally:
        api.close()
        agent.stop()
        serve.stop()
