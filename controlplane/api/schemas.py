"""Response schemas (kept apart from the store's tables)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str
    database: str
    bus: str
    agents_connected: int
    records_committed: int
    duplicates: int


class Job(BaseModel):
    job_id: str
    layers: int | None
    experts: int | None
    top_k: int | None
    world_size: int | None
    slots_per_rank: int | None
    ranks_per_node: int | None
    groups: int | None = None  # K expert groups, each kept on one node
    created_at: float
    latest_step: int | None
    nodes: list[str] | None = None


class Node(BaseModel):
    node_id: str
    hostname: str
    agent_version: str
    job_id: str | None
    ranks: list[int]
    first_seen: float
    last_seen: float
    connected: bool = False


class Device(BaseModel):
    device_id: str
    node_id: str
    index: int
    kind: str
    model: str
    memory_total_bytes: int
    rank: int


class DeviceLatest(BaseModel):
    device_id: str
    node_id: str
    ts: float
    metrics: dict[str, float]


class Sample(BaseModel):
    ts: float
    metric: str
    value: float


class Loads(BaseModel):
    step: int
    ts: float
    nodes_reported: int
    counts: list[list[int]] | list[int] = Field(description="[L, E] tokens per expert, or [E] for one layer")


class StepStat(BaseModel):
    step: int
    rank: int
    node_id: str
    ts: float
    step_time_s: float
    host_bound_ratio: float
    tokens: int


class ErrorBody(BaseModel):
    detail: str
