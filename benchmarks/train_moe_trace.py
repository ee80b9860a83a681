"""Record the per-step expert loads of a real tiny-MoE run for ``moeplane replay``.

    .venv/bin/python -m benchmarks.train_moe_trace --steps 300 --out train_moe.npy [--db DB]

Runs ``moeplane serve`` (SQLite) + ``moeplane agent`` + ``torchrun --nproc-per-node 4
examples/train_moe.py --agent-socket ...`` (gloo, CPU; 4 layers x 16 experts, top-2, 5 slots
per rank by default), as the README does; the control plane stores each step's global
``[L, E]`` router counts (and rebalances the job live: the counts do not depend on the
placement, the math is unchanged). Then the job's loads are read back the way ``moeplane
replay --job`` reads them and saved as ``[steps, L, E]`` int64. Replay it with

    moeplane replay --trace train_moe.npy --gpus 4 --slots-per-gpu 5 --report R.json

or, on the kept database, ``moeplane replay --job train-moe --database-url sqlite:///DB``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from moeplane.controlplane.cli.replay import job_trace
from moeplane.controlplane.procs import Procs, free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
JOB = "train-moe"


def record(steps: int, db: Path, work: Path) -> None:
    url = f"sqlite:///{db}"
    procs = Procs(work)
    try:
        serve = procs.start_serve(url)
        sock = work / "agent.sock"
        procs.spawn("agent", ["agent", "--node-id", "node-0", "--server", serve.grpc,
                              "--collector", "host", "--job-id", JOB, "--ranks", "0-3",
                              "--local-socket", str(sock), "--spool-dir", str(work / "spool")])
        wait_until(sock.exists, 60, "the agent's socket")
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        if torchrun is None:
            raise SystemExit("torchrun not found beside the interpreter (make torch)")
        subprocess.run(
            [torchrun, "--nproc-per-node", "4", "--master-port", str(free_port()),
             str(ROOT / "examples" / "train_moe.py"), "--agent-socket", str(sock),
             "--steps", str(steps), "--job-id", JOB, "--log-every", "50"],
            cwd=ROOT, check=True, timeout=3600,
        )
        api = httpx.Client(base_url=serve.http + "/api/v1", timeout=10)
        wait_until(lambda: (api.get(f"/jobs/{JOB}").json().get("latest_step") or 0) >= steps - 1,
                   60, "every step stored")
        api.close()
    finally:
        procs.reap()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", required=True, help="the trace, .npy")
    ap.add_argument("--db", help="keep the job's SQLite database here (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "train_moe.sqlite"
        record(args.steps, db, Path(tmp))
        trace, _ = job_trace(f"sqlite:///{db}", JOB)
    np.save(args.out, trace)
    print(f"{args.out}: {trace.shape[0]} steps x {trace.shape[1]} layers x {trace.shape[2]} "
          f"experts, {trace.sum(axis=2).mean():.0f} tokens per layer and step")


if __name__ == "__main__":
    main()
