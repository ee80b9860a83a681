"""torchtitan 0.3.0's MoE (aux-loss-free load balancing) on CPU: exact counts, and its
expert-bias update is the same with the adapter attached (run in tests.adapters.titan_worker).

torchtitan comes from the ``titan`` extra: ``make torch`` installs its pins into the overlay
``.venv/titan``, put on the worker's PYTHONPATH only (triton stays out of the main venv, where
DeepSpeed would use it on a GPU); an environment with the extra installed works too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moeplane.controlplane.procs import free_port

pytestmark = [pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
OVERLAY = Path(sys.prefix) / "titan"  # make torch: pip install --no-deps --target .venv/titan
if not (OVERLAY / "torchtitan").is_dir() and importlib.util.find_spec("torchtitan") is None:
    pytest.skip(f"no torchtitan: neither the overlay {OVERLAY} (make torch installs it) nor the "
                "titan extra", allow_module_level=True)
E, K, LAYERS = 8, 2, 3


def test_counts_are_exact_and_the_expert_bias_update_is_unchanged(tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
               LOCAL_RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(str(p) for p in (OVERLAY, ROOT) if p.is_dir()))
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
