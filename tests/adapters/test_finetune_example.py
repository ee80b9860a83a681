"""The README's transformers run: ``moeplane serve`` + ``moeplane agent`` + ``torchrun
--nproc-per-node 2 examples/finetune_hf_moe.py``: the unmodified HF model's per-step expert
loads, summed over both data-parallel ranks, come back through REST."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.procs import spawn, start_serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.torch]
ROOT = Path(__file__).resolve().parents[2]
STEPS, LAYERS, EXPERTS, TOP_K, BATCH, SEQ = 4, 2, 8, 2, 4, 32


def test_hf_example_loads_reach_the_control_plane(tmp_path):
    serve = start_serve(tmp_path, f"sqlite:///{tmp_path / 't.sqlite'}")
    sock = tmp_path / "agent.sock"
    agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", serve.grpc,
                            "--collector", "host", "--job-id", "hf", "--ranks", "0-1",
                            "--local-socket", str(sock), "--spool-dir", str(tmp_path / "spool")],
                  tmp_path)
    api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
    try:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        assert torchrun, "torchrun not found beside the interpreter (make torch)"
        run = subprocess.run(
            [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
             str(ROOT / "examples" / "finetune_hf_moe.py"), "--agent-socket", str(sock),
             "--steps", str(STEPS), "--job-id", "hf", "--layers", str(LAYERS),
             "--experts", str(EXPERTS), "--top-k", str(TOP_K), "--batch", str(BATCH),
             "--seq", str(SEQ), "--hidden", "64", "--micro-batches", "2"],
            cwd=ROOT, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        wait_until(lambda: (api.get("/jobs/hf").json().get("latest_step") or 0) >= STEPS - 1,
                   30, "all steps stored")
        job = api.get("/jobs/hf").json()
        assert (job["layers"], job["experts"], job["world_size"]) == (LAYERS, EXPERTS, 2)
        loads = api.get("/jobs/hf/loads", params={"step_start": 0, "step_end": STEPS}).json()
        assert [row["step"] for row in loads] == list(range(STEPS))
        per_step = 2 * 2 * BATCH * SEQ * TOP_K  # ranks x micro-batches x tokens x top-k
        for row in loads:
            assert [sum(layer) for layer in row["counts"]] == [per_step] * LAYERS
            assert len(row["counts"][0]) == EXPERTS
        stats = api.get("/jobs/hf/steps", params={"step_start": 1, "step_end": 2}).json()
        assert sorted(s["rank"] for s in stats) == [0, 1]
    finally:
        api.close()
        agent.stop()
        serve.stop()
