"""The README's expert-parallel transformers run: ``moeplane serve`` + ``moeplane agent`` +
``torchrun --nproc-per-node 4 examples/finetune_hf_moe_ep.py``. The control plane plans from the
unmodified Qwen3-MoE model's real router counts under the ``auto`` policy, every rank applies the
plan live, and on the steps after it the plan is better balanced than the placement it
replaced."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from moeplane.controlplane.balancing.placement import (
    gpu_loads,
    identity_placement,
    layer_balancedness,
)
from moeplane.controlplane.procs import free_port
from tests.procs import spawn, start_serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(600)]  # a loaded 2-core box
ROOT = Path(__file__).resolve().parents[2]
JOB, STEPS, LAYERS, EXPERTS, WORLD, SLOTS = "hf-ep", 30, 2, 8, 4, 3


def measured(loads: list[dict], phy2log: np.ndarray) -> float:
    """Mean over steps and layers of max/mean rank load under ``phy2log``."""
    return float(np.mean([
        layer_balancedness(gpu_loads(np.asarray(row["counts"], dtype=np.float64), phy2log,
                                     WORLD)).mean()
        for row in loads
    ]))


def applied_step(plan: dict) -> int | None:
    """The first step that ran ``plan`` (its APPLIED events carry it), None if none did."""
    steps = [e["step"] for e in plan["events"] if e["status"] == "applied" and e["step"] is not None]
    return min(steps) if steps else None


def get_list(api: httpx.Client, path: str, **params):
    r = api.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_hf_model_is_rebalanced_live_under_auto(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 't.sqlite'}")
    sock = tmp_path / "agent.sock"
    agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", serve.grpc,
                            "--collector", "host", "--job-id", JOB, "--ranks", "0-3",
                            "--local-socket", str(sock), "--spool-dir", str(tmp_path / "spool")],
                  tmp_path)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        r = api.put("/default-policy", json={"min_interval_s": 2, "sustain_steps": 3})
        assert r.status_code == 200, r.text
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        assert torchrun, "torchrun not found beside the interpreter (make torch)"
        run = subprocess.run(
            [torchrun, "--nproc-per-node", str(WORLD), "--master-port", str(free_port()),
             str(ROOT / "examples" / "finetune_hf_moe_ep.py"), "--agent-socket", str(sock),
             "--steps", str(STEPS), "--job-id", JOB, "--layers", str(LAYERS), "--experts",
             str(EXPERTS), "--slots-per-rank", str(SLOTS), "--batch", "4", "--seq", "32",
             "--hidden", "32", "--log-every", "5"],
            cwd=ROOT, capture_output=True, text=True, timeout=480,
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-4000:]
        assert "PLAN_STATE_APPLIED" in out, out[-4000:]
        wait_until(lambda: (api.get(f"/jobs/{JOB}").json().get("latest_step") or 0)
                   >= STEPS - 1, 30, "all steps stored")
        job = api.get(f"/jobs/{JOB}").json()
        assert (job["layers"], job["experts"], job["world_size"]) == (LAYERS, EXPERTS, WORLD)
        plans = [get_list(api, f"/jobs/{JOB}/plans/{p['epoch']}")
                 for p in sorted(get_list(api, f"/jobs/{JOB}/plans"), key=lambda p: p["epoch"])]
        ran = [p for p in plans if applied_step(p) is not None]  # applied, maybe superseded since
        assert ran, plans
        first = ran[0]
        switch = applied_step(first)
        end = STEPS if len(ran) == 1 else applied_step(ran[1])
        before = get_list(api, f"/jobs/{JOB}/loads", step_start=0, step_end=switch)
        after = get_list(api, f"/jobs/{JOB}/loads", step_start=switch, step_end=end)
        assert before and after
        initial = identity_placement(LAYERS, EXPERTS, WORLD * SLOTS)
        # on the steps that ran it, the plan beats the placement it replaced (the same loads:
        # training drift between the two windows cannot decide the comparison)
        assert measured(after, np.asarray(first["phy2log"])) < measured(after, initial)
    finally:
        api.close()
        agent.stop()
        serve.stop()
