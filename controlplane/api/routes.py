"""Routers: health, jobs (loads, step statistics), nodes, devices (latest, history)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel

from moeplane.controlplane.api.deps import EngineDep, RangeDep
from moeplane.controlplane.api.rules import RANGE, rules
from moeplane.controlplane.api.schemas import (
    Device,
    DeviceLatest,
    ErrorBody,
    Health,
    Job,
    Loads,
    Node,
    Sample,
    StepStat,
)
from moeplane.controlplane.auth.http import role_extra
from moeplane.controlplane.store import queries as q

NOT_FOUND = {404: {"model": ErrorBody, "description": "no such job, device or metric"}}


class BadRequestBody(BaseModel):
    """422: a domain check's message (str), or FastAPI's request validation errors (list)."""

    detail: str | list[dict[str, Any]]


BAD = {422: {"model": BadRequestBody, "description": "bad parameter"}}

router = APIRouter(prefix="/api/v1")
JobId = Annotated[str, Path(min_length=1, max_length=128)]


@router.get("/health", response_model=Health, tags=["health"], openapi_extra=role_extra("public"))
def health(request: Request, engine: EngineDep) -> Health:
    import sqlalchemy as sa

    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    state = request.app.state
    return Health(
        status="ok",
        database=engine.dialect.name,
        bus=getattr(state, "bus_name", "none"),
        agents_connected=len(state.ingest.connected) if getattr(state, "ingest", None) else 0,
        records_committed=state.batcher.committed if getattr(state, "batcher", None) else 0,
        duplicates=state.batcher.duplicates if getattr(state, "batcher", None) else 0,
    )


@router.get("/jobs", response_model=list[Job], tags=["jobs"])
def jobs(engine: EngineDep) -> list[dict]:
    return q.list_jobs(engine)


@router.get("/jobs/{job_id}", response_model=Job, responses=NOT_FOUND, tags=["jobs"])
def job(job_id: JobId, engine: EngineDep) -> dict:
    return q.get_job(engine, job_id)


@router.get("/jobs/{job_id}/loads/latest", response_model=Loads | None, responses=NOT_FOUND, tags=["jobs"])
def loads_latest(job_id: JobId, engine: EngineDep) -> dict | None:
    row = q.latest_loads(engine, job_id)
    return None if row is None else row | {"counts": row["counts"].tolist()}


@router.get("/jobs/{job_id}/loads", response_model=list[Loads], responses=NOT_FOUND | BAD, tags=["jobs"],
            openapi_extra=rules(RANGE))
def loads(
    job_id: JobId,
    engine: EngineDep,
    rng: RangeDep,
    layer: Annotated[int | None, Query(ge=0, le=1 << 16, description="only this MoE layer")] = None,
) -> list[dict]:
    return [r | {"counts": r["counts"].tolist()} for r in q.loads_history(engine, job_id, rng, layer)]


@router.get("/jobs/{job_id}/steps", response_model=list[StepStat], responses=NOT_FOUND | BAD, tags=["jobs"],
            openapi_extra=rules(RANGE))
def steps(
    job_id: JobId,
    engine: EngineDep,
    rng: RangeDep,
    rank: Annotated[int | None, Query(ge=0, le=1 << 20)] = None,
) -> list[dict]:
    return q.step_stats_history(engine, job_id, rng, rank)


@router.get("/nodes", response_model=list[Node], tags=["nodes"])
def nodes(
    request: Request,
    engine: EngineDep,
    job_id: Annotated[str | None, Query(max_length=128)] = None,
) -> list[dict]:
    connected = request.app.state.ingest.connected if getattr(request.app.state, "ingest", None) else {}
    return [n | {"connected": n["node_id"] in connected} for n in q.list_nodes(engine, job_id)]


@router.get("/devices", response_model=list[Device], tags=["devices"])
def devices(
    engine: EngineDep,
    node_id: Annotated[str | None, Query(max_length=128)] = None,
    job_id: Annotated[str | None, Query(max_length=128)] = None,
) -> list[dict]:
    return q.list_devices(engine, node_id=node_id, job_id=job_id)


@router.get("/devices/latest", response_model=list[DeviceLatest], tags=["devices"])
def devices_latest(
    engine: EngineDep, job_id: Annotated[str | None, Query(max_length=128)] = None
) -> list[dict]:
    latest = q.latest_device_values(engine, job_id)
    return [{"device_id": k} | v for k, v in sorted(latest.items())]


@router.get(
    "/devices/{device_id:path}/samples",
    response_model=list[Sample],
    responses=NOT_FOUND | BAD,
    tags=["devices"],
    openapi_extra=rules(RANGE),
)
def device_samples(
    device_id: str,
    engine: EngineDep,
    rng: RangeDep,
    metric: Annotated[str | None, Query(max_length=96)] = None,
) -> list[dict]:
    return q.device_history(engine, device_id, metric, rng)
