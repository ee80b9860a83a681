"""A small simulated job written straight into a store through ``StoreWriter``.

Used by the dashboard tests and ``benchmarks/dashboard.py``: N nodes × G devices, L layers ×
E experts, skewed expert popularity, device telemetry with a few planted hot spots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moeplane.controlplane.domain.lifecycle import Status
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

GIB = 1 << 30
METRICS = (
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "host_bound_ratio",
    "health_ok",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)


@dataclass
class SimJob:
    """Writes a job's hello, telemetry and per-step loads. ``seq`` per node grows by one."""

    writer: StoreWriter
    job_id: str = "job-a"
    nodes: int = 3
    devices_per_node: int = 8
    layers: int = 4
    experts: int = 16
    tokens_per_step: int = 4096
    seed: int = 0
    seq: dict = field(default_factory=dict)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        pop = self.rng.lognormal(0.0, 0.8, size=(self.layers, self.experts))
        self.popularity = pop / pop.sum(axis=1, keepdims=True)

    def node_id(self, n: int) -> str:
        return f"node-{n}"

    def device_ids(self, n: int) -> list[str]:
        return [f"node-{n}/gpu{d}" for d in range(self.devices_per_node)]

    def _next(self, node: str) -> int:
        self.seq[node] = self.seq.get(node, 0) + 1
        return self.seq[node]

    def hello(self, ts: float) -> None:
        g = self.devices_per_node
        for n in range(self.nodes):
            ranks = tuple(range(n * g, (n + 1) * g))
            self.writer.register_hello(
                HelloRecord(
                    node_id=self.node_id(n),
                    hostname=f"host{n}",
                    agent_version="test",
                    job_id=self.job_id,
                    ranks=ranks,
                    devices=tuple(
                        DeviceRecord(dev, d, "gpu", "H100", 80 * GIB, ranks[d])
                        for d, dev in enumerate(self.device_ids(n))
                    ),
                    job=JobRecord(self.job_id, self.layers, self.experts, 2, self.nodes * g, None, g),
                    ts=ts,
                )
            )

    def sample_values(self, n: int) -> np.ndarray:
        """float64 [G, M] telemetry of node ``n``: node 0 gpu 1 runs hot, node 1 gpu 2 is unhealthy."""
        g = self.devices_per_node
        r = self.rng
        v = np.empty((g, len(METRICS)))
        v[:, 0] = r.uniform(0.6, 0.95, g)
        v[:, 1] = r.uniform(40, 70, g) * GIB
        v[:, 2] = 80 * GIB
        v[:, 3] = r.uniform(45, 70, g)
        v[:, 4] = r.uniform(300, 500, g)
        v[:, 5] = r.uniform(0.0, 0.1, g)
        v[:, 6] = 1.0
        v[:, 7:9] = r.uniform(1e9, 5e9, (g, 2))
        v[:, 9:11] = r.uniform(50e9, 200e9, (g, 2))
        if n == 0 and g > 1:
            v[1, 3] = 91.0
        if n == 1 and g > 2:
            v[2, 6] = 0.0
        return v

    def samples(self, ts: float, overrides: dict | None = None) -> None:
        """One sample of every device; ``overrides`` {(device_id, metric): value}."""
        recs = []
        for n in range(self.nodes):
            v = self.sample_values(n)
            ids = self.device_ids(n)
            for (dev, metric), value in (overrides or {}).items():
                if dev in ids:
                    v[ids.index(dev), METRICS.index(metric)] = value
            recs.append(SamplesRecord(self.node_id(n), self._next(self.node_id(n)), ts, tuple(ids),
                                      METRICS, v))
        self.writer.write(recs)

    def step_counts(self, step: int) -> np.ndarray:
        """int64 [N, L, E]: each node's share of the step's routed tokens."""
        pvals = np.broadcast_to(self.popularity, (self.nodes, self.layers, self.experts))
        return self.rng.multinomial(self.tokens_per_step, pvals).astype(np.int64)

    def step(self, step: int, ts: float, counts: np.ndarray | None = None) -> np.ndarray:
        """Write loads and step statistics of ``step`` from every node; returns the global [L, E]."""
        parts = self.step_counts(step) if counts is None else counts
        g = self.devices_per_node
        recs = []
        for n in range(self.nodes):
            node = self.node_id(n)
            ranks = tuple(range(n * g, (n + 1) * g))
            recs.append(LoadsRecord(node, self._next(node), self.job_id, step, ts, ranks, (), parts[n]))
            recs.append(
                StepStatsRecord(
                    node, self._next(node), self.job_id, step, ts,
                    tuple(RankStatsRow(r, float(self.rng.uniform(0.9, 1.2)),
                                       float(self.rng.uniform(0, 0.2)), 4096) for r in ranks),
                )
            )
        self.writer.write(recs)
        return parts.sum(axis=0)

    # ------------------------------------------------------------------ plans and memory

    def ranks(self) -> int:
        return self.nodes * self.devices_per_node

    def slots_per_rank(self) -> int:
        return -(-self.experts // self.ranks())

    def identity(self) -> np.ndarray:
        """int64 [L, G*S]: slot s holds expert s % E."""
        row = np.arange(self.ranks() * self.slots_per_rank(), dtype=np.int64) % self.experts
        return np.tile(row, (self.layers, 1))

    def plan(self, phy2log: np.ndarray, status: str = "proposed", **fields) -> int:
        """Store a plan of ``phy2log`` [L, G*S] with ``status``; returns its epoch."""
        from moeplane.controlplane.store import plans as P

        return P.create_plan(self.writer.engine, self.job_id, phy2log, world_size=self.ranks(),
                             slots_per_rank=self.slots_per_rank(), status=Status(status), **fields)

    def apply(self, epoch: int, step: int) -> None:
        """Walk a plan to applied at ``step`` as the agents would: approved, pushed, applied."""
        from moeplane.controlplane.store import plans as P

        e = self.writer.engine
        P.transition(e, self.job_id, epoch, Status.APPROVED)
        P.transition(e, self.job_id, epoch, Status.PUSHED)
        for n in range(self.nodes):
            P.record_report(e, self.job_id, epoch, self.node_id(n), "applied", step)

    def memory(self, ts: float, step: int) -> None:
        """Memory profiles of every device (node 0 gpu 0 above 90 % of 80 GiB) and one offload
        decision proposed for that device."""
        from moeplane.controlplane.store import memory_profiles as M
        from moeplane.controlplane.store import offload as O

        e = self.writer.engine
        g = self.devices_per_node
        for n in range(self.nodes):
            profiles = []
            for d, dev in enumerate(self.device_ids(n)):
                params, grads, optim = 8 * GIB, 8 * GIB, 24 * GIB
                acts = (34 if (n, d) == (0, 0) else 20) * GIB
                profiles.append(M.ProfileRecord(
                    self.job_id, dev, self.node_id(n), n * g + d, step, ts, 80 * GIB,
                    params + grads + optim + acts + GIB, params, grads, optim, acts, 20e9, (), (),
                ))
            M.save_profiles(e, M.NodeMemoryRecord(self.job_id, self.node_id(n), step, ts, 256 * GIB), profiles)
        O.create_decision(
            e, self.job_id, device_id=self.device_ids(0)[0], node_id=self.node_id(0), rank=0,
            verdict="apply", actions=[{"kind": "swap_activations", "layers": ["layer.3", "layer.4"],
                                         "bytes_saved": 6 * GIB, "host_bytes": 6 * GIB,
                                         "overhead_s": 0.01, "prefetch": True}],
            undo=[], reason="peak 75 GiB above the high watermark 72 GiB", profile_step=step,
            capacity_bytes=80 * GIB, used_bytes=75 * GIB, peak_now_bytes=75 * GIB,
            predicted_peak_bytes=69 * GIB, high_watermark_bytes=72 * GIB, low_watermark_bytes=64 * GIB,
            host_bytes=6 * GIB, overhead_s=0.01, clock=lambda: ts,
        )
