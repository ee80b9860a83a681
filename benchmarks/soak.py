"""Memory of the control plane over a long run (soak): RSS of ``moeplane serve`` every 10 s.

    .venv/bin/python -m benchmarks.soak --minutes 30 --nodes 64 --out benchmarks/results/soak.json
    # telemetry at the full Pangu-scale rate (1,024 nodes × 8 devices × 16 metrics at 1 Hz =
    # 131k samples/s) beside the loads of 64 nodes:
    .venv/bin/python -m benchmarks.soak --minutes 30 --nodes 64 --sample-nodes 1024 \
        --lg-processes 2 --out soak-full.json

One real ``moeplane serve`` on a fresh PostgreSQL database and one ``moeplane loadgen``
(N nodes × 8 ranks, per-rank 58×256 loads every 10 s, 8 devices × 16 metrics at 1 Hz).
With ``--sample-nodes S`` the loads' nodes send no samples and a second loadgen (nodes
``tm-00000`` ...) sends S nodes' samples instead.
Writes the RSS series and a summary (first/last/max after warm-up, slope in MB per hour).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.scaleharness import Meter, loadgen, pg_database, read_json, start_serve
from moeplane.controlplane.loadgen.stats import summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--step-time", type=float, default=10)
    ap.add_argument("--sample-nodes", type=int, default=None,
                    help="nodes x 8 devices sampling at 1 Hz from a separate loadgen (default: the --nodes)")
    ap.add_argument("--lg-processes", type=int, default=1, help="processes of each loadgen")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with pg_database() as url:
        srv = start_serve(url, tmp, name="soak-serve")
        try:
            with Meter({"srv": srv.pid}, period_s=10) as meter:
                procs = ["--processes", str(a.lg_processes)]
                separate = a.sample_nodes is not None
                lg = loadgen([srv.grpc], tmp, "--nodes", str(a.nodes), "--step-time", str(a.step_time),
                             "--sample-interval", "0" if separate else "1", "--duration", str(a.minutes * 60),
                             "--job", "soak", *procs)
                tm = None
                if separate:
                    tm = loadgen([srv.grpc], tmp, "--nodes", str(a.sample_nodes), "--step-time", "0",
                                 "--sample-interval", "1", "--duration", str(a.minutes * 60), "--job", "soak-telemetry",
                                 "--node-prefix", "tm", *procs, name="telemetry")
                while lg.poll() is None or (tm is not None and tm.poll() is None):
                    time.sleep(10)
                    a.out.write_text(json.dumps({"partial": True, "commit": commit, "rss": [
                        (r["t"], r.get("srv_rss")) for r in meter.samples]}))
            s = summary(read_json(tmp))
            if tm is not None:
                s = {"loads": s, "telemetry": summary(read_json(tmp, "telemetry"))}
        finally:
            srv.stop()
    rows = [(r["t"], r["srv_rss"]) for r in meter.samples if "srv_rss" in r]
    t0 = rows[0][0]
    warm = [(t - t0, rss) for t, rss in rows if t - t0 >= 120]
    ts, rss = np.array([w[0] for w in warm]), np.array([w[1] for w in warm], dtype=float) / 2**20
    slope = float(np.polyfit(ts / 3600, rss, 1)[0]) if len(ts) > 2 else None
    cpu = [r for r in meter.samples if "srv" in r and r["t"] - t0 >= 120]
    span = cpu[-1]["t"] - cpu[0]["t"] if len(cpu) > 1 else 0.0
    windows = {}  # RSS median per 5-minute window, MB
    for t, r in rows:
        windows.setdefault(int((t - t0) // 300), []).append(r / 2**20)
    result = {
        "commit": commit, "minutes": a.minutes, "nodes": a.nodes,
        "rss_mb_after_warmup_first": float(rss[0]) if len(rss) else None,
        "rss_mb_last": float(rss[-1]) if len(rss) else None,
        "rss_mb_max": float(rss.max()) if len(rss) else None,
        "rss_slope_mb_per_hour": slope,
        "rss_mb_median_per_5min": [round(float(np.median(v)), 1) for _, v in sorted(windows.items())],
        # CPU after the 2-minute warm-up, as a share of one core
        "serve_cpu_share_after_warmup": (cpu[-1]["srv"] - cpu[0]["srv"]) / span if span else None,
        "postgres_cpu_share_after_warmup": (cpu[-1]["pg"] - cpu[0]["pg"]) / span if span else None,
        "loadgen": _brief(s),
        "rss": rows,
    }
    a.out.write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "rss"}, indent=2))
    return 0


def _brief(s: dict) -> dict:
    """The loadgen summary (or each of several) without its long message lists."""
    if "loads" in s and "telemetry" in s:
        return {k: _brief(v) for k, v in s.items()}
    return {k: v for k, v in s.items() if k not in ("error_messages", "stream_errors")}


if __name__ == "__main__":
    sys.exit(main())
