"""Run every benchmark of docs/benchmarks.md, one after another (``make bench``).

    .venv/bin/python benchmarks/run_all.py            # all of them (about 1.5 hours on 2 cores)
    .venv/bin/python benchmarks/run_all.py --list     # names and commands
    .venv/bin/python benchmarks/run_all.py --only planner fanout

Each benchmark is its own process, run with the same command the docs give, so that what a
page reports is what this runs. They run one at a time: two benchmarks side by side on a
small machine measure each other. Benchmarks that write a table (``--out``) write it under
``benchmarks/results/`` (not tracked): the docs pages add the text around the tables by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

#: name -> argv, in the order of docs/benchmarks.md's command table.
BENCHMARKS: dict[str, list[str]] = {
    "planner": [PY, "benchmarks/planner.py", "--replay-steps", "300"],
    "ingest": [PY, "-m", "benchmarks.ingest", "--nodes", "1024", "--step-time", "10", "--duration", "60",
               "--sample-nodes", "1024", "--lg-processes", "2", "--out", "benchmarks/results/ingest.md"],
    "durability": [PY, "-m", "benchmarks.durability", "--nodes", "32", "--duration", "40", "--kill-at", "15"],
    "replicas": [PY, "-m", "benchmarks.replicas", "--nodes", "64", "--step-time", "0.08", "--duration", "25",
                 "--lg-processes", "3"],
    "soak": [PY, "-m", "benchmarks.soak", "--minutes", "30", "--nodes", "64", "--sample-nodes", "1024",
             "--lg-processes", "2", "--out", "benchmarks/results/soak.json"],
    "fanout": [PY, "-m", "benchmarks.fanout", "--agents", "256", "1024", "--rounds", "20",
               "--out", "benchmarks/results/fanout.md"],
    "agent": [PY, "-m", "benchmarks.agent", "--seconds", "60", "--out", "benchmarks/results/agent.md"],
    "sdk": [PY, "benchmarks/sdk.py"],
    "routing": [PY, "-m", "benchmarks.routing", "--steps", "2"],
    "predictions": [PY, "-m", "benchmarks.predictions", "--steps", "600"],
    "train_moe_trace": [PY, "-m", "benchmarks.train_moe_trace", "--steps", "300",
                        "--out", "benchmarks/results/train_moe_trace.npy"],
    "replay_forecast": [PY, "-m", "benchmarks.replay_forecast",
                        "--train-trace", "benchmarks/results/train_moe_trace.npy"],
    "adapters": [PY, "benchmarks/adapters.py"],
    "hf_ep": [PY, "benchmarks/hf_ep.py"],
    "memory": [PY, "benchmarks/memory.py"],
    "dashboard": [PY, "-m", "benchmarks.dashboard", "--reps", "5", "--out", "benchmarks/results/dashboard.md"],
    "history": [PY, "benchmarks/history_storage.py", "--nodes", "8", "--seconds", "3600"],
    "rl": [PY, "-m", "benchmarks.rl_ingest", "--steps", "8", "--step-time", "2", "--out", "benchmarks/results/rl.md"],
    "rl_render": [PY, "-m", "benchmarks.rl_render", "--reps", "3", "--json", "benchmarks/results/rl_render.json"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the names and commands, run nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"run only these: {', '.join(BENCHMARKS)}")
    a = ap.parse_args(argv)
    names = a.only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    if a.list:
        for n in names:
            print(f"{n}: {' '.join(BENCHMARKS[n])}")
        return 0
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    failed = []
    for n in names:
        print(f"== {n}: {' '.join(BENCHMARKS[n])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(BENCHMARKS[n], cwd=ROOT)
        print(f"== {n}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc:
            failed.append(n)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
