"""attach() on transformers 4.x (4.57.3, gate an nn.Linear returning logits), in a separate
environment: an overlay of transformers 4.57.3 put before the venv's 5.x on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.torch, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
OVERLAY = Path(sys.prefix) / "transformers4"  # make torch: pip install --target .venv/transformers4


@pytest.mark.skipif(not (OVERLAY / "transformers").is_dir(),
                    reason=f"no transformers 4.x overlay at {OVERLAY} (make torch installs it)")
def test_mixtral_qwen2_qwen3_olmoe_4x_counts_are_exact(tmp_path):
    out = tmp_path / "tf4.pt"
    env = dict(os.environ, PYTHONPATH=f"{OVERLAY}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "tests.adapters.tf4_worker", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = torch.load(out, weights_only=False)
    assert result["version"].startswith("4.57")
    for family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        got = result[family]
        block = "block_sparse_moe" if family == "mixtral" else "mlp"
        assert got["layers"] == [f"model.layers.{i}.{block}" for i in range(3)], family
        assert got["identical"], family
        assert torch.equal(got["forward"], got["want"]), family
        assert torch.equal(got["train"], got["want_train"]), family
        assert got["forward"].sum().item() == 3 * 24 * 2
