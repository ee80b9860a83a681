"""The README's runs of unmodified frameworks: ``moeplane serve`` + ``moeplane agent`` +
``torchrun --nproc-per-node 2`` of ``examples/finetune_hf_moe.py`` (transformers, data
parallel) and ``examples/train_deepspeed_moe.py`` (DeepSpeed MoE, expert parallel): each step's
expert loads, summed over both ranks, come back through REST."""

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
STEPS, LAYERS, EXPERTS, TOP_K, BATCH, SEQ = 4, 2, 8, 2, 4, 32


def run_example(tmp_path, job: str, script: str, flags: list[str]) -> list[dict]:
    """Run ``script`` on 2 ranks against serve + agent; the job's REST loads of every step."""
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 't.sqlite'}")
    sock = tmp_path / "agent.sock"
    agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", serve.grpc,
                            "--collector", "host", "--job-id", job, "--ranks", "0-1",
                            "--local-socket", str(sock), "--spool-dir", str(tmp_path / "spool")],
                  tmp_path)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        assert torchrun, "torchrun not found beside the interpreter (make torch)"
        run = subprocess.run(
            [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
             str(ROOT / "examples" / script), "--agent-socket", str(sock), "--steps", str(STEPS),
             "--job-id", job, "--layers", str(LAYERS), "--experts", str(EXPERTS),
             "--top-k", str(TOP_K), "--batch", str(BATCH), "--seq", str(SEQ), *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        wait_until(lambda: (api.get(f"/jobs/{job}").json().get("latest_step") or 0) >= STEPS - 1,
                   30, "all steps stored")
        info = api.get(f"/jobs/{job}").json()
        assert (info["layers"], info["experts"], info["world_size"]) == (LAYERS, EXPERTS, 2)
        stats = api.get(f"/jobs/{job}/steps", params={"step_start": 1, "step_end": 2}).json()
        assert sorted(s["rank"] for s in stats) == [0, 1]
        return api.get(f"/jobs/{job}/loads", params={"step_start": 0, "step_end": STEPS}).json()
    finally:
        api.close()
        agent.stop()
        serve.stop()


def test_hf_example_loads_reach_the_control_plane(tmp_path):
    loads = run_example(tmp_path, "hf", "finetune_hf_moe.py",
                        ["--hidden", "64", "--micro-batches", "2"])
    assert [row["step"] for row in loads] == list(range(STEPS))
    per_step = 2 * 2 * BATCH * SEQ * TOP_K  # ranks x micro-batches x tokens x top-k
    for row in loads:
        assert [sum(layer) for layer in row["counts"]] == [per_step] * LAYERS
        assert len(row["counts"][0]) == EXPERTS


def test_deepspeed_example_loads_reach_the_control_plane(tmp_path):
    loads = run_example(tmp_path, "ds", "train_deepspeed_moe.py", ["--d-model", "32"])
    assert [row["step"] for row in loads] == list(range(STEPS))
    per_step = 2 * BATCH * SEQ * TOP_K  # ranks x tokens x top-k (exp_counts: before any drop)
    for row in loads:
        assert [sum(layer) for layer in row["counts"]] == [per_step] * LAYERS
