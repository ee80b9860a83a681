"""torchtitan 0.3.0's MoE (aux-loss-free load balancing) on CPU: exact counts, and its
expert-bias update is the same with the adapter attached (run in tests.adapters.titan_worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moeplane.controlplane.procs import free_port

pytest.importorskip("torchtitan.models.common.moe")  # the titan extra; make test skips it (README)
pytestmark = [pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
E, K, LAYERS = 8, 2, 3


def test_counts_are_exact_and_the_expert_bias_update_is_unchanged(tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
               LOCAL_RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1")
    out = tmp_path / "titan.pt"
    run = subprocess.run([sys.executable, "-m", "tests.adapters.titan_worker", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = torch.load(out, weights_only=False)
    plain, watched = result["plain"], result["watched"]
    assert result["layers"] == [f"layers.{i}.moe" for i in range(LAYERS)]
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(b["counts"], b["reference"])  # the router's own expert ids
        assert torch.equal(b["counts"].float(), b["titan"])  # torchtitan's tokens_per_expert_E
        assert torch.equal(a["titan"], b["titan"])
        assert torch.equal(a["bias"], b["bias"])  # its load balancing is undisturbed
    assert int(watched[0]["counts"].sum()) == LAYERS * 2 * (5 + 9) * K
    assert not torch.equal(watched[-1]["bias"], torch.zeros_like(watched[-1]["bias"]))
