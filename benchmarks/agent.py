"""Node-agent footprint: CPU (share of one core) and RSS at 1 Hz with 8 simulated devices.

Run from the repository root:

    .venv/bin/python -m benchmarks.agent --seconds 60

Three processes are measured in the same run, each for ``--seconds`` after a warm-up:

- baseline: a Python interpreter that imports what the agent imports (grpc, numpy, the wire
  modules, psutil) and sleeps: the floor any Python agent pays;
- agent, telemetry only: ``moeplane agent --collector sim --devices 8 --interval 1``;
- agent + job: the same agent while ``moeplane simulate`` runs 8 ranks on it with
  58 layers x 256 experts at one step per second (8 RankStep messages of 58x256 int64 per
  second to aggregate, one ExpertLoads and one StepStats up per step).

The control plane is a real ``moeplane serve`` on SQLite (dashboard off, controller idle),
started first. CPU comes from the process's user+system time
(``psutil.Process.cpu_times``) over the window; RSS is the largest of per-second readings.
Budget (ARCHITECTURE.md): <= 1 % of one core and <= 80 MB RSS.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from moeplane.controlplane.procs import MOEPLANE, start_serve

BASELINE = ("import grpc, numpy, psutil, sqlite3, time; "
            "from moeplane.controlplane.wire import moeplane_pb2, moeplane_pb2_grpc; time.sleep(1e6)")


def measure(proc: subprocess.Popen, seconds: float, warmup: float) -> tuple[float, float]:
    """(CPU share of one core, max RSS in MB) of ``proc`` over ``seconds`` after ``warmup``."""
    p = psutil.Process(proc.pid)
    time.sleep(warmup)
    t0, c0 = time.monotonic(), p.cpu_times()
    rss = 0
    end = t0 + seconds
    while time.monotonic() < end:
        rss = max(rss, p.memory_info().rss)
        time.sleep(1.0)
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
    t1, c1 = time.monotonic(), p.cpu_times()
    cpu = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0)
    return cpu, rss / 1e6


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def agent_cmd(server: str, tmp: Path) -> list[str]:
    return MOEPLANE + ["agent", "--node-id", "node-0",
            "--server", server, "--collector", "sim", "--devices", "8",
            "--interval", "1", "--spool-dir", str(tmp / "spool"), "--job-id", "bench",
            "--ranks", "0-7", "--local-socket", str(tmp / "node-0.sock"),
            "--log-level", "WARNING"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        db = tmp / "controlplane.sqlite"
        serve = start_serve(tmp, f"sqlite:///{db}", extra=["--no-dashboard", "--sample-interval", "1"],
                            env={"MOEPLANE_CONTROLLER_INTERVAL_S": "1e9"})
        try:
            base = subprocess.Popen([sys.executable, "-c", BASELINE])
            try:
                rows.append(("baseline: python + agent imports, idle",
                             *measure(base, args.seconds, args.warmup)))
            finally:
                stop(base)
            agent = subprocess.Popen(agent_cmd(serve.grpc, tmp))
            try:
                rows.append(("agent, telemetry only (8 sim devices, 1 Hz)",
                             *measure(agent, args.seconds, args.warmup)))
                sim = subprocess.Popen(MOEPLANE + [
                    "simulate", "--job-id", "bench",
                    "--nodes", "1", "--gpus-per-node", "8", "--layers", "58", "--experts", "256",
                    "--top-k", "8", "--tokens-per-step", "4096", "--step-time", "1",
                    "--agent-socket-template", str(tmp / "{node}.sock"), "--log-level", "WARNING"])
                try:
                    rows.append(("agent + job (8 ranks, 58x256 loads, 1 step/s)",
                                 *measure(agent, args.seconds, args.warmup)))
                finally:
                    stop(sim)
            finally:
                stop(agent)
        finally:
            serve.stop()
        with sqlite3.connect(db) as conn:
            stored = (conn.execute("SELECT count(*) FROM sample_frames").fetchone()[0],
                      conn.execute("SELECT count(*) FROM load_parts").fetchone()[0])
    base_cpu, base_rss = rows[0][1], rows[0][2]
    lines = [
        "# Node agent footprint",
        "",
        f"Command: `.venv/bin/python -m benchmarks.agent --seconds {args.seconds:g}"
        + (f" --out {args.out}" if args.out else "") + "`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared, noisy), "
        f"Python {platform.python_version()}. Window {args.seconds:g} s after "
        f"{args.warmup:g} s warm-up. Budget: <= 1 % of one core, <= 80 MB RSS.",
        "",
        "| process | CPU (% of one core) | max RSS (MB) | RSS / baseline | CPU - baseline |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, cpu, rss in rows:
        lines.append(f"| {name} | {cpu * 100 + 0.0:.2f} | {rss:.1f} | {rss / base_rss:.2f} | "
                     f"{(cpu - base_cpu) * 100:+.2f} |")
    lines += ["", f"Stored by the control plane during the run: {stored[0]} sample rounds, "
              f"{stored[1]} per-node expert-load steps."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
