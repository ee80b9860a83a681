"""Run one worker module as ``world`` real gloo ranks and load what each rank saved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from moeplane.controlplane.procs import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(module: str, out: Path, world: int, *args: str, timeout: float = 600,
              env: dict[str, str] | None = None) -> list:
    """``python -m module OUT *args`` as ranks 0..world-1; each writes ``OUT/rank{r}.pt``.
    ``env`` adds to each rank's environment (LOCAL_RANK and LOCAL_WORLD_SIZE are set too)."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                        OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module, str(out), *args], cwd=ROOT, env=rank_env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-6000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
