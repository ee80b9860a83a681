"""Ingest at scale: end-to-end cost of expert loads and device telemetry, against the bare
transport and a plain PostgreSQL COPY measured in the same run.

    .venv/bin/python -m benchmarks.ingest --nodes 128 --step-time 1.25 --duration 40 \
        --out benchmarks/results/ingest.md

Every scenario runs a real ``moeplane serve`` (or the bare transport server) and a real
``moeplane loadgen`` in separate processes on loopback. CPU is the serving process's
user+system time (psutil) from the loadgen's start to its exit (hello and drain included);
PostgreSQL server CPU is reported beside it. Scenarios:

- bare: ``benchmarks.bare_ingest`` — the same stream and bytes, numpy.frombuffer + sum;
- cp-pg / cp-sqlite: the control plane, loads only (per rank, no node aggregation);
- copy-loads: one Python process COPYs the same per-rank rows (job, step, rank, counts bytea);
- telemetry-pg: the control plane, device samples only; copy-frames / copy-narrow: the same
  frames (layout, ts, float32 [D, M] blob) and the same samples as narrow rows, by COPY;
- freshness-pg: loads again while polling REST ``/loads/latest`` every 50 ms: step finished
  (its timestamp) → the step's global matrix complete (all ranks summed) in the REST answer.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psycopg

from benchmarks.scaleharness import (
    NO_CONTROLLER,
    Meter,
    cpu_of,
    free_port,
    loadgen,
    pg_database,
    postgres_cpu,
    read_json,
    sqlite_database,
    start_serve,
)
from moeplane.controlplane.loadgen.stats import percentiles, summary


def run_loadgen_against(target_pid: int, target: str, tmp: Path, lg_args: list[str], name: str,
                        *, during=None, warmup_s: float = 15.0) -> dict:
    """Run loadgen against ``target``; CPU of ``target_pid`` and postgres over the run, and
    over its steady part (from ``warmup_s`` after the loadgen's start to its end: past the
    agents' hello storm) as ``steady_*``."""
    cpu0, pg0, t0 = cpu_of(target_pid), postgres_cpu(), time.time()
    with Meter({"srv": target_pid}) as meter:
        proc = loadgen([target], tmp, *lg_args, name=name)
        if during is not None:
            during(proc)
        proc.wait()
    cpu1, pg1, t1 = cpu_of(target_pid), postgres_cpu(), time.time()
    merged = read_json(tmp, name)
    s = summary(merged)
    start, end = merged["started_at"], merged["ended_at"]
    steady, secs = meter.delta("srv", start + 3, end)
    warm_srv, warm_secs = meter.delta("srv", start + warmup_s, end)
    warm_pg, _ = meter.delta("pg", start + warmup_s, end)
    return s | {"srv_cpu_s": cpu1 - cpu0, "pg_cpu_s": pg1 - pg0, "span_s": t1 - t0,
                "steady_core_share": steady / secs if secs > 0 else None,
                "steady_srv_cpu_s": warm_srv, "steady_pg_cpu_s": warm_pg, "steady_s": warm_secs,
                "warmup_s": warmup_s,
                "rss_max": max(r.get("srv_rss", 0) for r in meter.samples)}


def lg_loads_args(a, sample_interval: float = 0) -> list[str]:
    """The loads loadgen's arguments; ``sample_interval`` > 0 (seconds): its nodes also sample."""
    return ["--nodes", str(a.nodes), "--step-time", str(a.step_time), "--sample-interval", str(sample_interval),
            "--duration", str(a.duration), "--processes", str(a.lg_processes), "--job", "bench",
            "--max-in-flight", str(a.max_in_flight)] + (["--per-node"] if a.per_node else [])


def lg_samples_args(a) -> list[str]:
    return ["--nodes", str(a.sample_nodes), "--step-time", "0", "--sample-interval", "1",
            "--duration", str(a.duration), "--processes", str(a.lg_processes), "--job", "bench"]


def scenario_bare(a, tmp: Path) -> dict:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bare_ingest", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.stdout.readline()
    try:
        return run_loadgen_against(proc.pid, f"127.0.0.1:{port}", tmp, lg_loads_args(a), "bare")
    finally:
        proc.terminate()
        proc.wait(10)


def scenario_cp(a, tmp: Path, url: str, name: str, lg_args: list[str], *, during_factory=None) -> dict:
    srv = start_serve(url, tmp, name=name, env=None if a.with_controller else NO_CONTROLLER)
    try:
        during = during_factory(srv) if during_factory else None
        out = run_loadgen_against(srv.pid, srv.grpc, tmp, lg_args, name, during=during)
        if url.startswith("postgresql"):
            with psycopg.connect(url.replace("+psycopg", "")) as conn:
                out["frames_bytes"] = conn.execute(
                    "SELECT pg_total_relation_size('sample_frames')").fetchone()[0]
        out["serve"] = srv
        return out
    finally:
        srv.stop()


def _timed_copy(url: str, ddl: str, copy_sql: str, rows) -> dict:
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute(ddl)
        conn.commit()
        pg0, c0, w0 = postgres_cpu(), time.process_time(), time.perf_counter()
        with conn.cursor() as cur, cur.copy(copy_sql) as cp:
            for row in rows:
                cp.write_row(row)
        conn.commit()
        c1, w1, pg1 = time.process_time(), time.perf_counter(), postgres_cpu()
    return {"client_cpu_s": c1 - c0, "wall_s": w1 - w0, "pg_cpu_s": pg1 - pg0}


def scenario_copy_loads(a, url: str, messages: int) -> dict:
    L, E = 58, 256
    rng = np.random.default_rng(0)
    pool = [rng.integers(0, 4000, size=(L, E)).astype("<i4").tobytes() for _ in range(8)]
    rows = ((("bench", i // 8, i % 8, pool[i % 8])) for i in range(messages))
    out = _timed_copy(url, "CREATE TABLE copy_loads (job_id text, step bigint, rank int, counts bytea, "
                      "PRIMARY KEY (job_id, step, rank))",
                      "COPY copy_loads (job_id, step, rank, counts) FROM STDIN", rows)
    return out | {"counters": messages * L * E}


def scenario_copy_samples(a, url: str, frames: int, devices: int = 8, metrics: int = 16) -> dict:
    rng = np.random.default_rng(0)
    blob = rng.random((devices, metrics), dtype=np.float32).tobytes()
    frame_rows = ((i % a.sample_nodes, 1.7e9 + i, blob) for i in range(frames))
    f = _timed_copy(url, "CREATE TABLE copy_frames (layout int, ts float8, values bytea)",
                    "COPY copy_frames (layout, ts, values) FROM STDIN", frame_rows)
    vals = rng.random(devices * metrics, dtype=np.float32).tolist()
    narrow = ((i % (a.sample_nodes * devices), m, 1.7e9 + i // devices, vals[m])
              for i in range(frames * devices) for m in range(metrics))
    n = _timed_copy(url, "CREATE TABLE copy_narrow (device int, metric int, ts float8, value float4)",
                    "COPY copy_narrow (device, metric, ts, value) FROM STDIN", narrow)
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        f["bytes"] = conn.execute("SELECT pg_total_relation_size('copy_frames')").fetchone()[0]
        n["bytes"] = conn.execute("SELECT pg_total_relation_size('copy_narrow')").fetchone()[0]
    samples = frames * devices * metrics
    return {"frames": f, "narrow": n, "samples": samples}


def freshness_poller(expected_parts: int, results: list[float]):
    def factory(srv):
        def during(proc: subprocess.Popen):
            seen: set[int] = set()
            with httpx.Client(base_url=srv.http + "/api/v1", timeout=5) as http:
                while proc.poll() is None:
                    r = http.get("/jobs/bench/loads/latest")
                    if r.status_code == 200 and r.json():
                        body = r.json()
                        if body["nodes_reported"] >= expected_parts and body["step"] not in seen:
                            seen.add(body["step"])
                            results.append(time.time() - body["ts"])
                    time.sleep(0.05)
        return lambda proc: threading.Thread(target=during, args=(proc,), daemon=True).start()
    return factory


def per_million(cpu_s: float, counters: int) -> float:
    return cpu_s / max(counters, 1) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=128, help="nodes x 8 ranks reporting loads")
    ap.add_argument("--step-time", type=float, default=1.25)
    ap.add_argument("--sample-nodes", type=int, default=1024, help="nodes x 8 devices sampling at 1 Hz")
    ap.add_argument("--duration", type=float, default=40)
    ap.add_argument("--lg-processes", type=int, default=2)
    ap.add_argument("--max-in-flight", type=int, default=64)
    ap.add_argument("--per-node", action="store_true",
                    help="one ExpertLoads per node per step (agent-side aggregation) instead of per rank")
    ap.add_argument("--freshness-with-samples", action="store_true",
                    help="in the freshness scenario the loads' nodes also sample 8 devices x 16 metrics "
                         "at 1 Hz (what a node agent sends), not loads alone")
    ap.add_argument("--with-controller", action="store_true",
                    help="keep the rebalancing controller running (it plans for the emulated job)")
    ap.add_argument("--skip", default="", help="comma-separated scenarios to skip")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    res: dict = {}
    fresh: list[float] = []
    loads_per_node = 1 if a.per_node else 8  # ExpertLoads messages per node per step
    loads_msgs_per_s = a.nodes * loads_per_node / a.step_time
    print(f"loads: {a.nodes} nodes x 8 ranks, step {a.step_time}s = {loads_msgs_per_s:.0f} msg/s, "
          f"{loads_msgs_per_s * 58 * 256 / 1e6:.2f} M counters/s on the wire", flush=True)
    if "bare" not in skip:
        res["bare"] = scenario_bare(a, tmp)
        print("bare", res["bare"], flush=True)
    if "cp-pg" not in skip:
        with pg_database() as url:
            res["cp-pg"] = scenario_cp(a, tmp, url, "cp-pg", lg_loads_args(a))
            print("cp-pg", res["cp-pg"], flush=True)
            msgs = res["cp-pg"]["acked"].get("loads", 0)
            res["copy-loads"] = scenario_copy_loads(a, url, max(msgs, 1))
            print("copy-loads", res["copy-loads"], flush=True)
    if "cp-sqlite" not in skip:
        with sqlite_database() as url:
            res["cp-sqlite"] = scenario_cp(a, tmp, url, "cp-sqlite", lg_loads_args(a))
            print("cp-sqlite", res["cp-sqlite"], flush=True)
    if "telemetry" not in skip:
        with pg_database() as url:
            res["telemetry-pg"] = scenario_cp(a, tmp, url, "telemetry-pg", lg_samples_args(a))
            print("telemetry-pg", res["telemetry-pg"], flush=True)
            frames = res["telemetry-pg"]["acked"].get("samples", 0)
            res["copy-samples"] = scenario_copy_samples(a, url, max(frames, 1))
            print("copy-samples", res["copy-samples"], flush=True)
    if "freshness" not in skip:
        with pg_database() as url:
            res["freshness-pg"] = scenario_cp(
                a, tmp, url, "freshness-pg", lg_loads_args(a, 1 if a.freshness_with_samples else 0),
                during_factory=freshness_poller(a.nodes * loads_per_node, fresh))
            res["freshness-pg"]["freshness"] = percentiles(fresh) | {"steps": len(fresh)}
            print("freshness", res["freshness-pg"]["freshness"], flush=True)
    report = render(a, res, argv if argv is not None else sys.argv[1:])
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


def render(a, res: dict, argv) -> str:
    lines = [
        "# Ingest at scale", "",
        "Command: `.venv/bin/python -m benchmarks.ingest " + " ".join(argv) + "`", "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other engineers' work "
        "(noisy); every number below comes from one run, compare the ratios.", "",
        f"Load: {a.nodes} nodes × 8 ranks, one ExpertLoads of 58×256 int32 per "
        f"{'node (8 ranks summed by the agent)' if a.per_node else 'rank (no node aggregation)'} per "
        f"{a.step_time} s step; telemetry: {a.sample_nodes} nodes × 8 devices "
        f"× 16 metrics at 1 Hz; {a.duration} s per scenario. Rebalancing controller "
        f"{'ON' if a.with_controller else 'idle (MOEPLANE_CONTROLLER_INTERVAL_S=1e9)'}.", "",
        "| scenario | counters or samples acked | per s | serving CPU s | CPU s per M | "
        "postgres CPU s | steady share of a core | ack p50/p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("bare", "cp-pg", "cp-sqlite", "telemetry-pg"):
        r = res.get(name)
        if not r:
            continue
        n = r["counters_acked"] or r["samples_acked"]
        rate = r["counters_per_s"] or r["samples_per_s"]
        lines.append(
            f"| {name} | {n:,} | {rate:,.0f} | {r['srv_cpu_s']:.2f} | {per_million(r['srv_cpu_s'], n):.3f} | "
            f"{r['pg_cpu_s']:.2f} | {r['steady_core_share']:.3f} | "
            f"{r['ack_latency_ms_p50'] or 0:.1f}/{r['ack_latency_ms_p99'] or 0:.1f} |")
    lines += [""]
    if "copy-loads" in res and "cp-pg" in res:
        c = res["copy-loads"]
        copy_rate = c["counters"] / c["wall_s"]
        lines.append(f"Plain COPY of the same per-rank rows, one Python process: {c['counters']:,} counters "
                     f"in {c['wall_s']:.2f} s wall = {copy_rate / 1e6:.1f} M counters/s; client CPU "
                     f"{per_million(c['client_cpu_s'], c['counters']):.3f} s/M, postgres CPU "
                     f"{per_million(c['pg_cpu_s'], c['counters']):.3f} s/M.")
    if "freshness-pg" in res:
        f = res["freshness-pg"]["freshness"]
        lines.append(f"Freshness (step finished → its complete global matrix in REST /loads/latest, polled "
                     f"every 50 ms, separate run): p50 {f['p50'] or 0:.3f} s, p99 {f['p99'] or 0:.3f} s "
                     f"over {f['steps']} steps.")
    if "telemetry-pg" in res and "copy-samples" in res:
        t, c = res["telemetry-pg"], res["copy-samples"]
        n = t["samples_acked"]
        lines.append(
            f"Telemetry raw storage: {t['frames_bytes'] / max(n, 1):.2f} bytes per sample "
            f"(pg_total_relation_size('sample_frames') / samples). Plain COPY of the same samples from one "
            f"process: as frames {per_million(c['frames']['client_cpu_s'], c['samples']):.3f} s/M client + "
            f"{per_million(c['frames']['pg_cpu_s'], c['samples']):.3f} s/M postgres CPU "
            f"({c['frames']['bytes'] / c['samples']:.2f} B/sample); as narrow rows "
            f"(device, metric, ts, value) {per_million(c['narrow']['client_cpu_s'], c['samples']):.3f} s/M client + "
            f"{per_million(c['narrow']['pg_cpu_s'], c['samples']):.3f} s/M postgres "
            f"({c['narrow']['bytes'] / c['samples']:.1f} B/sample).")
        copy_per_m = per_million(c["narrow"]["client_cpu_s"] + c["narrow"]["pg_cpu_s"], c["samples"])
        whole = per_million(t["srv_cpu_s"] + t["pg_cpu_s"], n)
        lines.append(
            f"Telemetry vs the narrow-row COPY (serving + postgres CPU per M samples), whole run "
            f"(hello storm of {a.sample_nodes} agents included; the verdict uses this): "
            f"{per_million(t['srv_cpu_s'], n):.3f} + {per_million(t['pg_cpu_s'], n):.3f} = {whole:.3f} "
            f"vs {copy_per_m:.3f} = **{whole / copy_per_m:.2f}×**.")
        if t.get("steady_s"):
            # samples acked in the steady window, estimated at the run's mean acked rate (the
            # hello storm lowers that rate, so this overstates the steady cost if anything)
            steady_n = t["samples_per_s"] * t["steady_s"]
            steady = per_million(t["steady_srv_cpu_s"] + t["steady_pg_cpu_s"], steady_n)
            lines.append(
                f"Steady state ({t['steady_s']:.0f} s from {t['warmup_s']:.0f} s after the start to the end): "
                f"{per_million(t['steady_srv_cpu_s'], steady_n):.3f} + "
                f"{per_million(t['steady_pg_cpu_s'], steady_n):.3f} = {steady:.3f} s/M = "
                f"{steady / copy_per_m:.2f}× the COPY.")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
