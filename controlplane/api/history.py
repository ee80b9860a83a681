"""History router: aggregated queries over any time or step range, as JSON or CSV.

Every series is bucketed (``bucket_s``, default: at most 500 buckets over the range) and read
from the coarsest downsampled tier that fits, else raw (see moeplane.controlplane.store.history).
Pages hold at most ``limit`` buckets; pass ``next_start`` as ``start`` for the next page.
A JSON page is shared by identical reads (ReadCache): after 1 s it is refreshed in the
background while readers still get it, and it is never served more than 5 s after its
computation started. CSV is computed for each request.
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from typing import Annotated, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from moeplane.controlplane.api.deps import MAX_STEP, MAX_TIME, EngineDep, PlacementsDep
from moeplane.controlplane.api.plans import PlanSummary
from moeplane.controlplane.api.routes import BAD, NOT_FOUND, JobId
from moeplane.controlplane.api.rules import STEP_RANGE, rules
from moeplane.controlplane.domain.bounds import MAX_INT
from moeplane.controlplane.retention import RetentionPolicy
from moeplane.controlplane.store import history as H
from moeplane.controlplane.store import load_history as LH
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.queries import NotFound, require_job

router = APIRouter(prefix="/api/v1/history", tags=["history"])
CSV = {200: {"content": {"text/csv": {"schema": {"type": "string"}}},
             "description": "JSON page, or CSV rows with format=csv"}}
RESPONSES = NOT_FOUND | BAD | CSV

Start = Annotated[float | None, Query(ge=0, le=MAX_TIME, description="unix s, inclusive (rounded down to a bucket)")]
End = Annotated[float | None, Query(ge=0, le=MAX_TIME, description="unix s, exclusive (rounded up to a bucket)")]
StepStart = Annotated[int | None, Query(ge=0, le=MAX_STEP, description="from this step, inclusive")]
StepEnd = Annotated[int | None, Query(ge=0, le=MAX_STEP, description="to this step, exclusive")]
Bucket = Annotated[int | None, Query(ge=1, le=604800, description="bucket width, s; default: the range in one page (<= 500 buckets)")]
Limit = Annotated[int, Query(ge=1, le=H.MAX_BUCKETS, description="most buckets in this page")]
Format = Annotated[Literal["json", "csv"], Query(description="json (default) or csv")]
WINDOW = "end (default: now) must be after start"


class Page(BaseModel):
    bucket_s: int
    source: str
    start: int
    end: int
    next_start: int | None
    raw_from: int


class MetricPoint(BaseModel):
    start: int
    count: int
    mean: float
    max: float
    p95: float


class MetricHistory(Page):
    device_id: str
    metric: str
    items: list[MetricPoint]


class StepPoint(BaseModel):
    start: int
    rank: int
    count: int
    step_time_s_mean: float
    step_time_s_max: float
    step_time_s_p95: float
    host_bound_ratio_mean: float
    host_bound_ratio_max: float
    host_bound_ratio_p95: float
    tokens: int


class StepHistory(Page):
    job_id: str
    items: list[StepPoint]


class LoadPoint(BaseModel):
    start: int
    steps: int
    step_first: int
    step_last: int
    values: float | list[float] | list[list[float]]


class LoadHistory(Page):
    job_id: str
    view: str
    agg: str
    items: list[LoadPoint]


class PlanHistoryItem(PlanSummary):
    events: list[dict]


class DecisionItem(BaseModel):
    decision_id: int
    device_id: str
    node_id: str
    rank: int
    status: str
    verdict: str
    reason: str
    created_at: float
    updated_at: float
    applied_step: int | None


def _clock(request: Request) -> float:
    return getattr(request.app.state, "clock", time.time)()


def _policy(request: Request) -> RetentionPolicy:
    return getattr(request.app.state, "retention_policy", None) or RetentionPolicy()


def _window(request: Request, engine, start, end, step_start, step_end, bucket_s, limit, job_id=None,
            kind="samples") -> H.Window | None:
    if step_start is not None and step_end is not None and step_end <= step_start:
        raise ValueError("step_end: must be after step_start")
    if (step_start is not None or step_end is not None) and job_id is not None:
        span = H.steps_to_time(engine, job_id, step_start, step_end)
        if span is None:
            return None
        start = span[0] if start is None else max(start, span[0])
        end = span[1] if end is None else min(end, span[1])
    now = _clock(request)
    end = now if end is None else end
    start = end - H.DEFAULT_SPAN_S if start is None else start
    if end <= start:
        raise ValueError("end: must be after start")
    return H.plan_window(max(0.0, start), end, bucket_s, limit, now, _policy(request), raw_kind=kind)


async def _page(request: Request, format: str, compute, model, csv_columns) -> Response:
    """``compute()``'s page (a plain function, run in a worker thread): JSON shared by identical
    reads (ReadCache: at most ``max_stale_s`` old), or CSV computed for this request."""
    if format == "json":
        return await request.app.state.read_cache.json((request.url.path, request.url.query), compute, model)
    page = await asyncio.to_thread(compute)
    return _csv(csv_columns(page), page)


def _empty(bucket_s: int | None, **extra) -> dict:
    return {"bucket_s": bucket_s or 1, "source": "raw", "start": 0, "end": 0, "next_start": None,
            "raw_from": 0, "items": []} | extra


def _csv(table: tuple[list[dict], list[str]], page: dict) -> Response:
    rows, columns = table
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([r[c] for c in columns])
    headers = {"X-Bucket-Seconds": str(page["bucket_s"]), "X-Source": page["source"]}
    if page["next_start"] is not None:
        headers["X-Next-Start"] = str(page["next_start"])
    return Response(buf.getvalue(), media_type="text/csv", headers=headers)


@router.get("/devices", response_model=MetricHistory, responses=RESPONSES, openapi_extra=rules(WINDOW))
async def device_metric(
    request: Request, engine: EngineDep,
    device_id: Annotated[str, Query(min_length=1, max_length=160)],
    metric: Annotated[str, Query(min_length=1, max_length=96)],
    start: Start = None, end: End = None, bucket_s: Bucket = None, limit: Limit = 500, format: Format = "json",
):
    """count, mean, max, p95 of one device metric per bucket (units: the metric's suffix)."""

    def compute() -> dict:
        win = _window(request, engine, start, end, None, None, bucket_s, limit)
        return H.device_metric(engine, device_id, metric, win)

    return await _page(request, format, compute, MetricHistory,
                       lambda page: (page["items"], ["start", "count", "mean", "max", "p95"]))


@router.get("/jobs/{job_id}/steps", response_model=StepHistory, responses=RESPONSES,
            openapi_extra=rules(WINDOW, STEP_RANGE))
async def step_stats(
    job_id: JobId, request: Request, engine: EngineDep,
    rank: Annotated[int | None, Query(ge=0, le=1 << 20)] = None,
    start: Start = None, end: End = None, step_start: StepStart = None, step_end: StepEnd = None,
    bucket_s: Bucket = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100, format: Format = "json",
):
    """Per bucket and rank: step time (s) and host-bound ratio mean/max/p95, tokens summed."""

    def compute() -> dict:
        require_job(engine, job_id)
        win = _window(request, engine, start, end, step_start, step_end, bucket_s, limit, job_id, "steps")
        if win is None:
            return _empty(bucket_s, job_id=job_id)
        return H.step_stats(engine, job_id, win, rank, (step_start, step_end))

    return await _page(request, format, compute, StepHistory,
                       lambda page: (page["items"], list(StepPoint.model_fields)))


@router.get("/jobs/{job_id}/loads", response_model=LoadHistory, responses=RESPONSES,
            openapi_extra=rules(WINDOW, STEP_RANGE))
async def loads(
    job_id: JobId, request: Request, engine: EngineDep, placements: PlacementsDep,
    view: Annotated[Literal["matrix", "layer", "expert", "ranks"], Query()] = "matrix",
    agg: Annotated[Literal["mean", "max", "p95"], Query(description="over the steps of a bucket")] = "mean",
    layer: Annotated[int | None, Query(ge=0, le=1 << 16)] = None,
    expert: Annotated[int | None, Query(ge=0, le=1 << 20)] = None,
    start: Start = None, end: End = None, step_start: StepStart = None, step_end: StepEnd = None,
    bucket_s: Bucket = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100, format: Format = "json",
):
    """Tokens per step per bucket: matrix [L, E], layer [E], expert [L] (or one number with
    layer), or ranks [G] under the placement that was running (summed over layers or one)."""

    def compute() -> dict:
        require_job(engine, job_id)
        win = _window(request, engine, start, end, step_start, step_end, bucket_s, limit, job_id, "loads")
        if win is None:
            return _empty(bucket_s, job_id=job_id, view=view, agg=agg)
        return LH.load_history(engine, job_id, win, view=view, agg=agg, layer=layer, expert=expert,
                               steps=(step_start, step_end), placements=placements)

    return await _page(request, format, compute, LoadHistory, lambda page: (
        _long_rows(page, view, layer, expert), ["start", "steps", "index_0", "index_1", "value"]))


def _long_rows(page: dict, view: str, layer, expert) -> list[dict]:
    """One CSV row per value: index_0/index_1 are (layer, expert), (expert, ''), (layer, '')
    or (rank, '') by view."""
    rows = []
    for it in page["items"]:
        base = {"start": it["start"], "steps": it["steps"]}
        v = it["values"]
        if isinstance(v, float):
            rows.append(base | {"index_0": layer, "index_1": expert, "value": v})
        elif v and isinstance(v[0], list):
            rows += [base | {"index_0": i, "index_1": j, "value": x} for i, r in enumerate(v) for j, x in enumerate(r)]
        else:
            rows += [base | {"index_0": i, "index_1": "", "value": x} for i, x in enumerate(v)]
    return rows


@router.get("/jobs/{job_id}/plans", response_model=list[PlanHistoryItem], responses=NOT_FOUND | BAD)
async def plans(
    job_id: JobId, engine: EngineDep, start: Start = None, end: End = None,
    after_epoch: Annotated[int, Query(ge=0, le=MAX_INT, description="page after this epoch")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict]:
    """Plans created in [start, end), oldest first, each with its event history."""
    def read() -> list[dict]:
        require_job(engine, job_id)
        p = t.plans.c
        q = sa.select(*P.SUMMARY_COLUMNS).where(
            p.job_id == job_id, p.epoch > after_epoch).order_by(p.epoch).limit(limit)
        if start is not None:
            q = q.where(p.created_at >= start)
        if end is not None:
            q = q.where(p.created_at < end)
        with engine.connect() as conn:
            out = [dict(r) for r in conn.execute(q).mappings()]
            ev = t.plan_events.c
            for plan in out:
                plan["events"] = [dict(r) for r in conn.execute(
                    sa.select(ev.ts, ev.status, ev.node_id, ev.step, ev.detail)
                    .where(ev.job_id == job_id, ev.epoch == plan["epoch"]).order_by(ev.id)).mappings()]
        return out

    return await asyncio.to_thread(read)


@router.get("/jobs/{job_id}/decisions", response_model=list[DecisionItem], responses=NOT_FOUND | BAD)
async def decisions(
    job_id: JobId, engine: EngineDep, start: Start = None, end: End = None,
    after_id: Annotated[int, Query(ge=0, le=MAX_INT, description="page after this decision id")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict]:
    """Memory-offload decisions created in [start, end), oldest first."""
    def read() -> list[dict]:
        require_job(engine, job_id)
        d = t.offload_decisions.c
        q = sa.select(*[d[k] for k in DecisionItem.model_fields]).where(
            d.job_id == job_id, d.decision_id > after_id).order_by(d.decision_id).limit(limit)
        if start is not None:
            q = q.where(d.created_at >= start)
        if end is not None:
            q = q.where(d.created_at < end)
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    return await asyncio.to_thread(read)


__all__ = ["router", "NotFound"]
