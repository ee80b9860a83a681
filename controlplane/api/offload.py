"""Offload router: memory breakdown per device, offload decisions (approve/reject), policy."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from moeplane.controlplane.api.deps import EngineDep, ExecutorDep
from moeplane.controlplane.api.policy import OffloadPolicyChanges
from moeplane.controlplane.api.routes import BAD, NOT_FOUND, JobId
from moeplane.controlplane.api.rules import rules
from moeplane.controlplane.api.schemas import ErrorBody
from moeplane.controlplane.domain.bounds import MAX_INT
from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.store import memory_profiles as M
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import queries as q

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["offload"])
CONFLICT = {409: {"model": ErrorBody, "description": "the decision's state does not allow this"}}
DecisionId = Annotated[int, Path(ge=1, le=MAX_INT)]


class DecisionRef(BaseModel):
    decision_id: int
    status: str
    verdict: str
    predicted_peak_bytes: int
    measured_used_bytes: int | None
    reason: str


class LayerProfile(BaseModel):
    name: str
    activation_bytes: int
    forward_s: float
    backward_s: float
    parameter_bytes: int
    optimizer_bytes: int


class DeviceMemoryView(BaseModel):
    device_id: str
    node_id: str
    rank: int
    step: int
    ts: float
    capacity_bytes: int
    used_bytes: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: int
    other_bytes: int = Field(description="used minus the breakdown: workspace, cache, buffers")
    host_link_bytes_per_s: float
    host_free_bytes: int | None = Field(description="free host memory of the device's node")
    high_watermark_bytes: int
    low_watermark_bytes: int
    applied_actions: list[str] = Field(description='"kind:layer" in effect')
    decision: DecisionRef | None = Field(description="the device's newest offload decision")
    layers: list[LayerProfile] | None = None


class ActionView(BaseModel):
    kind: str
    layers: list[str]
    bytes_saved: int
    host_bytes: int
    overhead_s: float
    prefetch: bool


class UndoView(BaseModel):
    kind: str
    layer: str


class DecisionSummary(BaseModel):
    decision_id: int
    job_id: str
    device_id: str
    node_id: str
    rank: int
    status: str
    verdict: str
    reason: str
    actions: list[ActionView] = Field(description="the complete set to have in effect")
    undo: list[UndoView] = Field(description="actions in effect that this decision drops")
    profile_step: int
    created_at: float
    updated_at: float
    capacity_bytes: int
    used_bytes: int
    peak_now_bytes: int
    predicted_peak_bytes: int
    predicted_saved_bytes: int = Field(description="peak_now_bytes - predicted_peak_bytes")
    high_watermark_bytes: int
    low_watermark_bytes: int
    host_bytes: int
    overhead_s: float
    applied_step: int | None
    measured_used_bytes: int | None
    measured_saved_bytes: int | None
    error: str


class DecisionEvent(BaseModel):
    ts: float
    status: str
    node_id: str | None
    step: int | None
    detail: str


class DecisionDetail(DecisionSummary):
    events: list[DecisionEvent]


class OffloadPolicyView(BaseModel):
    mode: str
    high_watermark: float
    low_watermark: float
    decision_timeout_s: float


def _summary(d: dict) -> dict:
    return d | {"predicted_saved_bytes": d["peak_now_bytes"] - d["predicted_peak_bytes"]}


@router.get("/memory", response_model=list[DeviceMemoryView], responses=NOT_FOUND)
async def memory(
    job_id: JobId, engine: EngineDep, layers: Annotated[bool, Query(description="include per-layer rows")] = False
) -> list[dict]:
    return await asyncio.to_thread(M.memory_breakdown, engine, job_id, with_layers=layers)


@router.get("/offload/decisions", response_model=list[DecisionSummary], responses=NOT_FOUND)
async def list_decisions(
    job_id: JobId,
    engine: EngineDep,
    status: Annotated[Status | None, Query()] = None,
    device_id: Annotated[str | None, Query(max_length=160)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict]:
    await asyncio.to_thread(q.require_job, engine, job_id)
    rows = await asyncio.to_thread(O.list_decisions, engine, job_id, device_id=device_id, status=status, limit=limit)
    return [_summary(d) for d in rows]


@router.get("/offload/decisions/{decision_id}", response_model=DecisionDetail, responses=NOT_FOUND)
async def get_decision(job_id: JobId, decision_id: DecisionId, engine: EngineDep) -> dict:
    d = await asyncio.to_thread(O.get_decision, engine, job_id, decision_id)
    return _summary(d) | {"events": await asyncio.to_thread(O.decision_events, engine, decision_id)}


@router.post("/offload/decisions/{decision_id}/approve", response_model=DecisionSummary,
             responses=NOT_FOUND | CONFLICT)
async def approve(job_id: JobId, decision_id: DecisionId, executor: ExecutorDep) -> dict:
    return _summary(await executor.approve_decision(job_id, decision_id))


@router.post("/offload/decisions/{decision_id}/reject", response_model=DecisionSummary,
             responses=NOT_FOUND | CONFLICT)
async def reject(job_id: JobId, decision_id: DecisionId, executor: ExecutorDep) -> dict:
    return _summary(await executor.reject_decision(job_id, decision_id))


@router.get("/offload/policy", response_model=OffloadPolicyView, responses=NOT_FOUND)
async def get_policy(job_id: JobId, engine: EngineDep) -> dict:
    return (await asyncio.to_thread(O.get_policy, engine, job_id)).to_dict()


@router.put("/offload/policy", response_model=OffloadPolicyView, responses=NOT_FOUND | BAD,
            openapi_extra=rules("low_watermark must stay below high_watermark (with the settings not given "
                                "kept as they are)"))
async def set_policy(job_id: JobId, engine: EngineDep, body: OffloadPolicyChanges) -> dict:
    return (await asyncio.to_thread(O.set_policy, engine, job_id, body.changes())).to_dict()
