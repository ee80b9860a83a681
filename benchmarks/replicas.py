"""Horizontal scale: the ingest ceiling with one and with two control-plane replicas behind
Redis and PostgreSQL, measured in the same run.

    .venv/bin/python -m benchmarks.replicas --nodes 64 --step-time 0.25 --duration 30 \
        --out benchmarks/results/replicas.md

For R in (1, 2): R real ``moeplane serve`` processes on one fresh PostgreSQL database with the
Redis bus; ``moeplane loadgen`` spreads its nodes over them (node n → replica n mod R) and
offers more per-rank loads than one replica takes (the senders fall behind their schedule:
``max_lag_s``). The ceiling is what is acknowledged per second. CPU of each replica, of
PostgreSQL and of the load generator is reported, since all share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.scaleharness import (
    NO_CONTROLLER,
    REDIS,
    cpu_of,
    loadgen,
    pg_database,
    postgres_cpu,
    read_json,
    start_serve,
)
from moeplane.controlplane.loadgen.stats import summary


def tree_cpu(pid: int) -> float:
    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            c = q.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def one(replicas: int, a, tmp: Path) -> dict:
    with pg_database() as url:
        servers = [start_serve(url, tmp, redis_url=REDIS, name=f"rep{replicas}-{i}", env=NO_CONTROLLER)
                   for i in range(replicas)]
        try:
            cpu0 = [cpu_of(s.pid) for s in servers]
            pg0 = postgres_cpu()
            lg = loadgen([s.grpc for s in servers], tmp, "--nodes", str(a.nodes), "--step-time",
                         str(a.step_time), "--sample-interval", "0", "--duration", str(a.duration),
                         "--processes", str(a.lg_processes), "--job", "rep", name=f"rep{replicas}")
            lg_cpu = 0.0
            while lg.poll() is None:
                lg_cpu = max(lg_cpu, tree_cpu(lg.pid))
                time.sleep(0.5)
            cpu = [cpu_of(s.pid) - c for s, c in zip(servers, cpu0, strict=True)]
            pg = postgres_cpu() - pg0
        finally:
            for s in servers:
                s.stop()
    s = summary(read_json(tmp, f"rep{replicas}"))
    return {"replicas": replicas, "counters_per_s": s["counters_per_s"], "acked": s["acked"],
            "errors": s["errors"], "max_lag_s": s["max_lag_s"], "ack_p99_ms": s["ack_latency_ms_p99"],
            "serve_cpu_s": cpu, "pg_cpu_s": pg, "loadgen_cpu_s": lg_cpu, "wall_s": s["wall_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--step-time", type=float, default=0.25)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--lg-processes", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    rows = []
    for r in (1, 2):
        rows.append(one(r, a, tmp))
        print(rows[-1], flush=True)
    offered = a.nodes * 8 / a.step_time * 58 * 256
    lines = [
        "# Two replicas: how far one more moves the ingest ceiling", "",
        "Command: `.venv/bin/python -m benchmarks.replicas " + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared by the replicas, PostgreSQL, Redis, the "
        "load generator and other engineers' work (noisy). Offered: "
        f"{a.nodes} nodes × 8 ranks × 58×256 per {a.step_time} s = {offered / 1e6:.1f} M counters/s.", "",
        "| replicas | acked M counters/s | ratio to 1 | serve CPU s (each) | postgres CPU s | loadgen CPU s | "
        "sender lag max s | ack p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = rows[0]["counters_per_s"] or 1
    for r in rows:
        lines.append(f"| {r['replicas']} | {r['counters_per_s'] / 1e6:.2f} | {r['counters_per_s'] / base:.2f} | "
                     f"{', '.join(f'{c:.1f}' for c in r['serve_cpu_s'])} | {r['pg_cpu_s']:.1f} | "
                     f"{r['loadgen_cpu_s']:.1f} | {r['max_lag_s']:.1f} | {r['ack_p99_ms'] or 0:.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
