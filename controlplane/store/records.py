"""Validated records handed from the ingest edge to the store (plain data, no protobuf).

Arrays: ``SamplesRecord.values`` float32 or float64 [D, M] (from ingest: a read-only view of the
wire bytes; the store writes float32); ``LoadsRecord.counts`` int32 or int64 [L, E] (a read-only
view of the wire bytes: no copy per message; the store sums into int64).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DeviceRecord:
    device_id: str
    index: int
    kind: str
    model: str
    memory_total_bytes: int
    rank: int


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    layers: int | None = None
    experts: int | None = None
    top_k: int | None = None
    world_size: int | None = None
    slots_per_rank: int | None = None
    ranks_per_node: int | None = None
    groups: int | None = None  # K expert groups, each kept on one node (group-limited routing)


@dataclass(frozen=True)
class HelloRecord:
    node_id: str
    hostname: str
    agent_version: str
    job_id: str
    ranks: tuple[int, ...]
    devices: tuple[DeviceRecord, ...]
    job: JobRecord | None
    ts: float


@dataclass(frozen=True)
class SamplesRecord:
    node_id: str
    seq: int
    ts: float
    device_ids: tuple[str, ...]
    metrics: tuple[str, ...]
    values: np.ndarray  # float32 or float64 [D, M]; NaN = not measured


@dataclass(frozen=True)
class LoadsRecord:
    node_id: str
    seq: int
    job_id: str
    step: int
    ts: float
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    counts: np.ndarray  # int32 or int64 [L, E], read-only


@dataclass(frozen=True)
class RankStatsRow:
    rank: int
    step_time_s: float
    host_bound_ratio: float
    tokens: int


@dataclass(frozen=True)
class StepStatsRecord:
    node_id: str
    seq: int
    job_id: str
    step: int
    ts: float
    ranks: tuple[RankStatsRow, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class MarkerRecord:
    """A sequenced message that stores nothing but must still be deduplicated (e.g. a report)."""

    node_id: str
    seq: int


SequencedRecord = SamplesRecord | LoadsRecord | StepStatsRecord | MarkerRecord
