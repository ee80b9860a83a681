"""Synthetic history written through the real store writer: device frames, step statistics
and expert loads every ``every_s`` seconds from ``t0`` (unix s), reproducible from a seed."""

from __future__ import annotations

import numpy as np

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

METRICS = ("utilization_ratio", "memory_used_bytes", "temperature_celsius")
LAYERS, EXPERTS, RANKS = 4, 8, 2


def fill(engine, t0: float, seconds: float, every_s: float = 10.0, seed: int = 0, node: str = "n0",
         job: str = "j") -> dict:
    """Write the data; returns {"ts": [N], "frames": [N, D, M] float32, "loads": [N, L, E]}."""
    rng = np.random.default_rng(seed)
    w = StoreWriter(engine)
    devs = tuple(DeviceRecord(f"{node}/gpu{i}", i, "sim", "m", 80 << 30, i) for i in range(RANKS))
    w.register_hello(HelloRecord(node, "h", "v", job, tuple(range(RANKS)), devs,
                                 JobRecord(job, layers=LAYERS, experts=EXPERTS, world_size=RANKS,
                                           slots_per_rank=EXPERTS // RANKS), t0))
    n = int(seconds // every_s)
    ts = t0 + every_s * np.arange(n) + rng.uniform(0, every_s / 2, n)
    frames = np.stack([rng.uniform(0, 1, n), rng.uniform(1e9, 8e10, n), rng.uniform(30, 90, n)], axis=-1)
    frames = np.stack([frames, frames[::-1]], axis=1).astype(np.float32)  # [N, D=2, M=3]
    frames[rng.uniform(size=frames.shape) < 0.05] = np.nan  # some not measured
    loads = rng.integers(0, 1000, size=(n, LAYERS, EXPERTS))
    step_time = rng.uniform(0.5, 2.0, (n, RANKS))
    host_bound = rng.uniform(0, 1, (n, RANKS))
    records, seq = [], 0
    for i in range(n):
        seq += 3
        records += [
            SamplesRecord(node, seq - 2, float(ts[i]), tuple(d.device_id for d in devs), METRICS,
                          frames[i].astype(np.float64)),
            LoadsRecord(node, seq - 1, job, i, float(ts[i]), tuple(range(RANKS)), (), loads[i]),
            StepStatsRecord(node, seq, job, i, float(ts[i]), tuple(
                RankStatsRow(r, float(step_time[i, r]), float(host_bound[i, r]), 100 + r) for r in range(RANKS))),
        ]
    for k in range(0, len(records), 600):
        w.write(records[k: k + 600])
    return {"ts": ts, "frames": frames, "loads": loads, "step_time": step_time, "host_bound": host_bound}
