"""Two real gloo ranks, data parallel: each rank counts the tokens it routed, exactly."""

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


def test_each_data_parallel_rank_counts_its_own_tokens(tmp_path):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.dist_worker", str(tmp_path)], cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        logs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank]}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert ranks[0]["layers"] == ["module.model.layers.0.mlp", "module.model.layers.1.mlp"]
    for step in range(2):
        per_rank = [r["steps"][step] for r in ranks]
        for got in per_rank:
            assert torch.equal(got["counts"], got["reference"])
        assert not torch.equal(per_rank[0]["counts"], per_rank[1]["counts"])
        for got in per_rank:
            assert torch.equal(got["total"], got["reference_all"])
        # rank r routes 2 micro-batches of [2, 10 + r] tokens to 2 experts in 2 layers
        assert [int(g["counts"].sum()) for g in per_rank] == [2 * 2 * 2 * 2 * (10 + r)
                                                              for r in range(WORLD)]
