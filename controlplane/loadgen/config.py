"""What the load generator emulates: nodes × ranks, the job's [L, E], step time, sampling."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadgenConfig:
    """One load-generator run.

    targets: control-plane gRPC addresses ``host:port``; node ``n`` connects to
        ``targets[n % len(targets)]`` (replicas behind a static spread).
    nodes: emulated node agents N, one bidirectional stream each.
    ranks_per_node: training ranks per node (also devices per node).
    layers, experts: the job's [L, E] count matrix.
    per_rank: True sends one ExpertLoads per rank per step (``ranks=[r]``, no node aggregation);
        False sends one per node per step (``ranks`` = the node's ranks).
    step_time_s: seconds per training step; 0 sends no loads.
    sample_interval_s: seconds between device-sample rounds (one [D, M] frame per node); 0: none.
    metrics: metrics per device M.
    duration_s: how long to run (seconds); the run ends at the first step boundary after it.
    node_offset: index of the first node (several processes split one job).
    max_in_flight: unacknowledged messages per stream before the agent waits.
    dtype: wire dtype of the counts, "int32" or "int64".
    apply_plans: report each received plan as applied (like a real agent).
    start_at: unix time of step 0's start (aligns processes); None: now.
    """

    targets: tuple[str, ...] = ("127.0.0.1:50051",)
    job_id: str = "loadgen"
    nodes: int = 4
    ranks_per_node: int = 8
    layers: int = 58
    experts: int = 256
    per_rank: bool = True
    step_time_s: float = 10.0
    sample_interval_s: float = 1.0
    metrics: int = 16
    duration_s: float = 30.0
    node_offset: int = 0
    world_nodes: int | None = None
    max_in_flight: int = 64
    dtype: str = "int32"
    apply_plans: bool = True
    start_at: float | None = None
    seed: int = 0
    node_prefix: str = "lg"

    def __post_init__(self):
        if not self.targets:
            raise ValueError("targets: give at least one host:port")
        for name in ("nodes", "ranks_per_node", "layers", "experts", "metrics", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("step_time_s", "sample_interval_s", "duration_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.node_offset < 0:
            raise ValueError(f"node_offset: must be >= 0, got {self.node_offset}")
        if self.dtype not in ("int32", "int64"):
            raise ValueError(f"dtype: must be int32 or int64, got {self.dtype!r}")
        if self.world_nodes is not None and self.world_nodes < self.node_offset + self.nodes:
            raise ValueError("world_nodes: must cover node_offset + nodes")

    @property
    def total_nodes(self) -> int:
        """Nodes in the whole emulated job (across processes)."""
        return self.world_nodes or self.node_offset + self.nodes

    @property
    def counters_per_step(self) -> int:
        """Expert counters this process reports per step: N × ranks × L × E (per rank)."""
        per = self.ranks_per_node if self.per_rank else 1
        return self.nodes * per * self.layers * self.experts

    def node_id(self, n: int) -> str:
        return f"{self.node_prefix}-{n:05d}"
