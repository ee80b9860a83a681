"""DeepSpeed 0.19 MoE on the CPU accelerator, 2 gloo ranks, expert parallel: exact counts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import free_port

pytestmark = [pytest.mark.torch, pytest.mark.slow]
WORLD = 2
ROOT = Path(__file__).resolve().parents[2]


def test_each_expert_parallel_rank_counts_its_gates_decisions_exactly(tmp_path):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                   OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.ds_worker", str(tmp_path)], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        logs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert ranks[0]["layers"] == [f"layers.{i}.deepspeed_moe" for i in range(3)]
    for got in ranks:
        assert torch.equal(got["counts"], got["exp_counts"])  # DeepSpeed's own exp_counts
        assert torch.equal(got["counts"], got["reference"])  # recomputed from the logits
        assert got["counts"].sum(1).tolist() == [2 * (12 + 7 + 20)] * 3
    assert not torch.equal(ranks[0]["counts"], ranks[1]["counts"])
