"""Agent messages the load generator sends. Pure: arrays in, protobuf messages out.

Counts are drawn once per run into a small pool of [L, E] matrices (skewed, like real
routing) and reused across ranks and steps, so generating load costs little CPU.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.loadgen.config import LoadgenConfig
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array

POOL = 8
METRIC_PREFIX = "lg_metric_"


def count_pool(cfg: LoadgenConfig) -> list[pb.NDArray]:
    """``POOL`` encoded count matrices [L, E] of ``cfg.dtype``: tokens routed per expert."""
    rng = np.random.default_rng(cfg.seed)
    weights = rng.zipf(1.5, size=(cfg.layers, cfg.experts)).clip(max=1000).astype(np.float64)
    weights /= weights.sum(axis=1, keepdims=True)
    tokens = 4096 * 8 if cfg.per_rank else 4096 * 8 * cfg.ranks_per_node
    pool = []
    for _ in range(POOL):
        counts = np.stack([rng.multinomial(tokens, w) for w in weights]).astype(cfg.dtype)
        pool.append(encode_array(counts))
    return pool


def device_ids(cfg: LoadgenConfig, n: int) -> list[str]:
    return [f"{cfg.node_id(n)}/dev{d}" for d in range(cfg.ranks_per_node)]


def ranks_of(cfg: LoadgenConfig, n: int) -> list[int]:
    return [n * cfg.ranks_per_node + r for r in range(cfg.ranks_per_node)]


def hello(cfg: LoadgenConfig, n: int) -> pb.AgentMessage:
    ranks = ranks_of(cfg, n)
    world = cfg.total_nodes * cfg.ranks_per_node
    return pb.AgentMessage(
        seq=0,
        hello=pb.Hello(
            node_id=cfg.node_id(n),
            hostname=f"host-{cfg.node_id(n)}",
            agent_version="loadgen",
            devices=[
                pb.DeviceInfo(device_id=did, index=d, kind="sim", model="LoadgenGPU",
                              memory_total_bytes=64 << 30, rank=ranks[d])
                for d, did in enumerate(device_ids(cfg, n))
            ],
            job_id=cfg.job_id,
            ranks=ranks,
            job=pb.JobSpec(
                job_id=cfg.job_id, layers=cfg.layers, experts=cfg.experts, top_k=8,
                world_size=world, slots_per_rank=max(1, -(-cfg.experts // world)),
                ranks_per_node=cfg.ranks_per_node,
            ),
        ),
    )


def loads(cfg: LoadgenConfig, n: int, step: int, ts: float, pool: list[pb.NDArray]) -> list[pb.ExpertLoads]:
    """The loads one node sends for ``step``: one per rank (per_rank) or one for the node."""
    ranks = ranks_of(cfg, n)
    groups = [[r] for r in ranks] if cfg.per_rank else [ranks]
    return [
        pb.ExpertLoads(job_id=cfg.job_id, step=step, ranks=g, counts=pool[(g[0] + step) % len(pool)], timestamp=ts)
        for g in groups
    ]


def step_stats(cfg: LoadgenConfig, n: int, step: int, ts: float) -> pb.StepStats:
    return pb.StepStats(
        job_id=cfg.job_id, step=step, timestamp=ts,
        ranks=[pb.RankStepStats(rank=r, step_time_s=cfg.step_time_s, host_bound_ratio=0.05, tokens=4096)
               for r in ranks_of(cfg, n)],
    )


def metric_names(cfg: LoadgenConfig) -> list[str]:
    return [f"{METRIC_PREFIX}{m}" for m in range(cfg.metrics)]


def samples(cfg: LoadgenConfig, n: int, ts: float, rng: np.random.Generator) -> pb.DeviceSamples:
    """One sampling round of a node: float32 [D, M]."""
    values = rng.random((cfg.ranks_per_node, cfg.metrics), dtype=np.float32)
    return pb.DeviceSamples(
        timestamp=ts, device_ids=device_ids(cfg, n), metrics=metric_names(cfg),
        values=encode_array(values),
    )
