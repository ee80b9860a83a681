"""Storage per raw frame and per tier row on PostgreSQL, and a history query served from raw
vs from the 1-min tier. Prints a markdown table; usage:

    .venv/bin/python benchmarks/history_storage.py [--pg postgresql://postgres@127.0.0.1:5432/test]

Shape: N nodes x 8 devices x 16 metrics at 1 Hz; 8 ranks per node; steps every 10 s; loads
[58, 256]. Sizes are pg_total_relation_size (heap + TOAST + indexes) divided by rows.
"""

from __future__ import annotations

import argparse
import time
import uuid

import numpy as np
import psycopg
import sqlalchemy as sa

from moeplane.controlplane.retention import RetentionPolicy
from moeplane.controlplane.store import history as H
from moeplane.controlplane.store import tiers
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.records import (
    DeviceRecord,
    HelloRecord,
    JobRecord,
    LoadsRecord,
    RankStatsRow,
    SamplesRecord,
    StepStatsRecord,
)
from moeplane.controlplane.store.writes import StoreWriter

D, M, L, E, RPN = 8, 16, 58, 256, 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=1800)
    a = ap.parse_args()
    name = f"moeplane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(a.pg, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = a.pg.rsplit("/", 1)[0] + "/" + name
    try:
        run(url, a.nodes, a.seconds)
    finally:
        with psycopg.connect(a.pg, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(url: str, nodes: int, seconds: int) -> None:
    upgrade(url)
    eng = make_engine(url)
    w = StoreWriter(eng)
    rng = np.random.default_rng(0)
    t0 = 1_700_000_000.0
    metrics = tuple(f"m{i}_ratio" for i in range(M))
    for n in range(nodes):
        devs = tuple(DeviceRecord(f"n{n}/d{i}", i, "sim", "x", 1, n * RPN + i) for i in range(D))
        w.register_hello(HelloRecord(f"n{n}", "h", "v", "j", tuple(range(n * RPN, (n + 1) * RPN)), devs,
                                     JobRecord("j", layers=L, experts=E), t0))
    seq = dict.fromkeys(range(nodes), 0)
    batch = []
    for s in range(seconds):
        for n in range(nodes):
            seq[n] += 1
            vals = rng.uniform(0, 1, (D, M))
            batch.append(SamplesRecord(f"n{n}", seq[n], t0 + s, tuple(f"n{n}/d{i}" for i in range(D)), metrics, vals))
            if s % 10 == 0:
                seq[n] += 2
                batch.append(LoadsRecord(f"n{n}", seq[n] - 1, "j", s // 10, t0 + s, tuple(range(n * RPN, (n + 1) * RPN)),
                                         (), rng.integers(0, 5000, (L, E))))
                batch.append(StepStatsRecord(f"n{n}", seq[n], "j", s // 10, t0 + s, tuple(
                    RankStatsRow(r, 1.0, 0.2, 4096) for r in range(n * RPN, (n + 1) * RPN))))
        if len(batch) >= 2000:
            w.write(batch)
            batch = []
    w.write(batch)
    policy = RetentionPolicy(raw_s=10 * 86400, loads_s=10 * 86400)
    for kind in tiers.KINDS:
        for tier in tiers.TIERS:
            tiers.rollup(eng, kind, tier, t0 + seconds + 7200)
    with eng.connect() as c:
        sizes = {}
        for table in ("sample_frames", "received", "expert_loads", "load_parts", "step_stats", "sample_rollups",
                      "step_rollups", "load_rollups"):
            b = c.execute(sa.text(f"SELECT pg_total_relation_size('{table}')")).scalar()
            rows = c.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
            sizes[table] = (b, rows)
    print("| table | rows | bytes | bytes/row |\n|---|---|---|---|")
    for k, (b, r) in sizes.items():
        print(f"| {k} | {r} | {b} | {b / max(r, 1):.0f} |")
    per = {k: b / max(r, 1) for k, (b, r) in sizes.items()}
    project(per, nodes)
    # query: one device metric over the whole range at 60 s buckets, raw vs tier
    now = t0 + seconds + 7200
    win_tier = H.plan_window(t0, t0 + seconds, 60, 10_000, now, policy)
    raw_pol = RetentionPolicy(raw_s=10 * 86400, loads_s=10 * 86400, minute_s=1, hour_s=1)
    win_raw = H.plan_window(t0, t0 + seconds, 30, 10_000, now, raw_pol)  # 30 s: no tier divides it
    for label, win in (("tier 60s", win_tier), ("raw (30 s buckets)", win_raw)):
        best = min(_timed(lambda win=win: H.device_metric(eng, "n0/d3", "m5_ratio", win)) for _ in range(5))
        print(f"query {label}: {best * 1e3:.1f} ms (source {win.source_name})")
    eng.dispose()


def project(per: dict, nodes_measured: int, nodes: int = 1024) -> None:
    """Bytes per day for ``nodes`` nodes (8 devices x 16 metrics at 1 Hz, 8 ranks each, 10 s
    steps, one job) from the measured bytes per row. Step and load tier rows scale with ranks
    and are measured at 8 x nodes_measured ranks; they are scaled linearly to 8 x nodes ranks."""
    day, steps = 86400, 8640
    scale = nodes / nodes_measured
    rows = {
        "sample_frames (raw)": (day * nodes, per["sample_frames"]),
        "received (dedup claims, raw window)": (day * nodes + 2 * steps * nodes, per["received"]),
        "step_stats (raw)": (steps * nodes * RPN, per["step_stats"]),
        "expert_loads (raw, per job)": (steps, per["expert_loads"]),
        "load_parts (raw)": (steps * nodes, per["load_parts"]),
        "sample_rollups 1-min": (1440 * nodes, per["sample_rollups"]),
        "sample_rollups 1-h": (24 * nodes, per["sample_rollups"]),
        "step_rollups 1-min": (1440, per["step_rollups"] * scale),
        "step_rollups 1-h": (24, per["step_rollups"] * scale),
        "load_rollups 1-min": (1440, per["load_rollups"]),
        "load_rollups 1-h": (24, per["load_rollups"]),
    }
    print(f"\n| per day, {nodes} nodes | rows/day | bytes/row | GB/day |\n|---|---|---|---|")
    for k, (n, b) in rows.items():
        print(f"| {k} | {n:,} | {b:,.0f} | {n * b / 1e9:.2f} |")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
