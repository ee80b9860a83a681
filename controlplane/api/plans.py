"""Plans router: list/get plans, approve, reject, roll back, push an operator's placement,
dry-run, policy."""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Body, Path, Query
from pydantic import BaseModel, Field, StrictInt

from moeplane.controlplane.api.deps import EngineDep, ExecutorDep, PlacementsDep
from moeplane.controlplane.api.policy import PolicyChanges
from moeplane.controlplane.api.routes import BAD, NOT_FOUND, JobId
from moeplane.controlplane.api.rules import JOB_SHAPE, rules
from moeplane.controlplane.api.schemas import ErrorBody
from moeplane.controlplane.balancing import count_moves, plan_placement
from moeplane.controlplane.balancing.validate import check_placement
from moeplane.controlplane.domain.bounds import MAX_INT, MAX_INT32
from moeplane.controlplane.domain.lifecycle import IN_FLIGHT, Conflict, Status
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.placements import PlacementSource, identity

router = APIRouter(prefix="/api/v1/jobs/{job_id}", tags=["plans"])
CONFLICT = {409: {"model": ErrorBody, "description": "the plan's state does not allow this"}}
Epoch = Annotated[int, Path(ge=1, le=MAX_INT)]


class PlanSummary(BaseModel):
    job_id: str
    epoch: int
    status: str
    kind: str
    base_epoch: int
    created_at: float
    updated_at: float
    layers: int
    world_size: int
    slots_per_rank: int
    moves: int
    cross_node_moves: int
    predicted_before: float | None
    predicted_after: float | None
    measured_before: float | None
    measured_after: float | None
    measured_step: int | None
    applied_step: int | None
    reason: str


class PlanEvent(BaseModel):
    ts: float
    status: str
    node_id: str | None
    step: int | None
    detail: str


class PlanDetail(PlanSummary):
    phy2log: list[list[int]] = Field(description="[L, G*S] logical expert of each physical slot")
    events: list[PlanEvent]


class RollbackRequest(BaseModel):
    epoch: StrictInt = Field(ge=0, le=MAX_INT, description="epoch to return to; 0 = the initial placement")


class PlacementRequest(BaseModel):
    phy2log: list[list[StrictInt]] = Field(
        description="[L, G*S] logical expert of each physical slot (e.g. `moeplane plan --out`)"
    )
    reason: str = Field(default="", max_length=500, description="why; kept with the plan")


class DryRunRequest(BaseModel):
    loads: list[list[float]] | None = Field(default=None, description="[L, E]; default: recent loads")
    steps: StrictInt = Field(default=20, ge=1, le=10_000, description="recent steps averaged when no loads given")
    max_moves: StrictInt | None = Field(default=None, ge=0, le=MAX_INT32)
    incremental: bool = True
    search: Literal["repair", "relieve"] = Field(
        default="repair",
        description="incremental search: repair (default, fewer moves) or relieve (most loaded GPUs first)")


class DryRunResult(BaseModel):
    balancedness_before: float
    balancedness_after: float
    moves: int
    cross_node_moves: int
    phy2log: list[list[int]]


class PolicyBody(BaseModel):
    model_config = {"extra": "allow"}


def _summary(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k in PlanSummary.model_fields}


@router.get("/plans", response_model=list[PlanSummary], responses=NOT_FOUND)
async def list_plans(
    job_id: JobId,
    engine: EngineDep,
    status: Annotated[Status | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict]:
    await asyncio.to_thread(q.require_job, engine, job_id)
    return [_summary(p) for p in await asyncio.to_thread(P.list_plans, engine, job_id, status=status, limit=limit)]


@router.get("/plans/{epoch}", response_model=PlanDetail, responses=NOT_FOUND)
async def get_plan(job_id: JobId, epoch: Epoch, engine: EngineDep) -> dict:
    plan = await asyncio.to_thread(P.get_plan, engine, job_id, epoch)
    events = await asyncio.to_thread(P.plan_events, engine, job_id, epoch)
    return _summary(plan) | {"phy2log": plan["phy2log"].tolist(), "events": events}


@router.post("/plans/{epoch}/approve", response_model=PlanSummary, responses=NOT_FOUND | CONFLICT)
async def approve(job_id: JobId, epoch: Epoch, executor: ExecutorDep) -> dict:
    return _summary(await executor.approve_plan(job_id, epoch))


@router.post("/plans/{epoch}/reject", response_model=PlanSummary, responses=NOT_FOUND | CONFLICT)
async def reject(job_id: JobId, epoch: Epoch, executor: ExecutorDep) -> dict:
    return _summary(await executor.reject_plan(job_id, epoch))


async def _push_at_once(executor, placements: PlacementSource, job_id: str, target_of) -> dict:
    """Create a plan approved by the operator and push it at once (rollback, given placement).

    ``target_of(job, running)`` returns ``(phy2log [L, G*S], create_plan arguments)`` or raises
    (422/409/404); ``running`` is the job's running Placement. 409 while another plan is being
    applied.
    """
    engine = executor.engine

    def make() -> int:
        job = q.get_job(engine, job_id)
        running = placements.running(job)
        if running is None:
            raise Conflict(f"job {job_id!r} has no known geometry yet")
        target, kwargs = target_of(job, running)
        if P.latest_plan(engine, job_id, IN_FLIGHT, with_placement=False) is not None:
            raise Conflict("a plan is being applied; wait for it to finish")
        geo = running.geometry
        return P.create_plan(engine, job_id, target, world_size=geo.ranks,
                             slots_per_rank=geo.slots_per_rank, status=Status.APPROVED, **kwargs)

    return _summary(await executor.push_plan(job_id, await asyncio.to_thread(make)))


@router.post("/rollback", response_model=PlanSummary, responses=NOT_FOUND | CONFLICT | BAD)
async def rollback(job_id: JobId, body: RollbackRequest, executor: ExecutorDep,
                   placements: PlacementsDep, engine: EngineDep) -> dict:
    def target_of(job: dict, running):
        if body.epoch == 0:
            target = identity(running.geometry).phy2log
        else:
            plan = P.get_plan(engine, job_id, body.epoch)
            if plan["status"] not in (Status.APPLIED, Status.ROLLED_BACK):
                raise Conflict(f"plan {body.epoch} was never applied ({plan['status']}); cannot roll back to it")
            target = plan["phy2log"]
        return target, {"kind": "rollback", "base_epoch": body.epoch,
                        "reason": f"rollback to epoch {body.epoch} by operator"}

    return await _push_at_once(executor, placements, job_id, target_of)


@router.post("/plans", response_model=PlanSummary, responses=NOT_FOUND | CONFLICT | BAD,
             openapi_extra=rules(JOB_SHAPE, "phy2log holds every expert of each layer at least once"))
async def push_placement(job_id: JobId, body: PlacementRequest, executor: ExecutorDep,
                         placements: PlacementsDep) -> dict:
    """Push an operator's placement (e.g. from ``moeplane plan``) as a new plan, at once.

    ``phy2log`` must be ``[L, G*S]`` of expert ids in ``[0, E)`` with every expert in every
    layer (422 naming the problem otherwise); 409 while another plan is being applied.
    """
    def target_of(job: dict, running):
        geo = running.geometry
        if job.get("layers") is None:
            raise Conflict(f"job {job_id!r} has no known geometry yet")
        widths = {len(row) for row in body.phy2log}
        if len(widths) > 1:
            raise ValueError(f"phy2log: rows have different lengths {sorted(widths)[:4]}")
        try:
            given = np.asarray(body.phy2log, dtype=np.int64)
        except OverflowError:
            raise ValueError("phy2log: holds an expert id outside the int64 range") from None
        target = check_placement("phy2log", given, job["layers"], geo.slots, job["experts"])
        return target, {"kind": "operator", "base_epoch": running.epoch,
                        "moves": int(count_moves(running.phy2log, target, geo.ranks, job["experts"]).sum()),
                        "reason": body.reason or "placement given by operator"}

    return await _push_at_once(executor, placements, job_id, target_of)


@router.post("/plans/dry-run", response_model=DryRunResult, responses=NOT_FOUND | BAD, openapi_extra=rules(
    JOB_SHAPE, "the job has a known geometry, and stored loads when the body gives none"))
async def dry_run(job_id: JobId, engine: EngineDep, placements: PlacementsDep,
                  body: Annotated[DryRunRequest, Body()]) -> dict:
    def run() -> dict:
        job = q.get_job(engine, job_id)
        running = placements.running(job)
        if running is None:
            raise ValueError(f"job {job_id!r} has no known geometry (layers, experts, ranks) yet")
        geo = running.geometry
        world, slots, nodes = geo.ranks, geo.slots_per_rank, geo.nodes
        if body.loads is not None:
            loads = np.asarray(body.loads, dtype=np.float64)
            if loads.shape != (job["layers"], job["experts"]):
                raise ValueError(f"loads: shape {loads.shape} must be [{job['layers']}, {job['experts']}]")
        else:
            latest = job["latest_step"]
            if latest is None:
                raise ValueError("loads: the job has no loads yet; pass them in the body")
            hist = q.loads_history(engine, job_id, q.Range(step_start=max(0, latest - body.steps + 1)))
            loads = np.mean([h["counts"] for h in hist], axis=0)
        current = running.phy2log
        plan = plan_placement(
            loads, gpus=world, slots_per_gpu=slots, nodes=nodes,
            current=current if body.incremental else None,
            max_moves=body.max_moves if body.incremental else None, search=body.search,
            groups=job.get("groups") or None,
        )
        from moeplane.controlplane.balancing import balancedness, count_moves

        return {
            "balancedness_before": balancedness(loads, current, world),
            "balancedness_after": plan.balancedness_after,
            "moves": int(count_moves(current, plan.phy2log, world, loads.shape[1]).sum()),
            "cross_node_moves": plan.cross_node_moves,
            "phy2log": plan.phy2log.tolist(),
        }

    return await asyncio.to_thread(run)


@router.get("/policy", responses=NOT_FOUND)
async def get_policy(job_id: JobId, engine: EngineDep) -> dict[str, Any]:
    policy = await asyncio.to_thread(P.get_policy, engine, job_id)
    return _policy_dict(policy)


@router.put("/policy", responses=NOT_FOUND | BAD)
async def set_policy(job_id: JobId, engine: EngineDep, body: PolicyChanges) -> dict[str, Any]:
    policy = await asyncio.to_thread(P.set_policy, engine, job_id, body.changes())
    return _policy_dict(policy)


default_router = APIRouter(prefix="/api/v1", tags=["plans"])


@default_router.get("/default-policy")
async def get_default_policy(engine: EngineDep) -> dict[str, Any]:
    """The rebalancing policy of jobs that have none of their own."""
    return _policy_dict(await asyncio.to_thread(P.get_policy, engine, P.DEFAULT_POLICY))


@default_router.put("/default-policy", responses=BAD)
async def set_default_policy(engine: EngineDep, body: PolicyChanges) -> dict[str, Any]:
    return _policy_dict(await asyncio.to_thread(P.set_policy, engine, P.DEFAULT_POLICY, body.changes()))


def _policy_dict(policy) -> dict[str, Any]:
    import json

    d = json.loads(policy.to_json())
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
