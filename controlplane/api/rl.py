"""RL router: a job's phase spans, a binned timeline, phase seconds per step and device, weight
syncs, consumed batches, idle analysis and a Chrome-trace export, over a step range
[step_start, step_end).

Without a range the newest ``step_window.DEFAULT_STEPS`` steps with spans are read. A range with
step_end <= step_start, or wider than ``MAX_STEPS``, is refused with 422.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Query
from pydantic import BaseModel

from moeplane.controlplane.api.deps import MAX_STEP, EngineDep
from moeplane.controlplane.api.routes import BAD, NOT_FOUND, JobId
from moeplane.controlplane.api.rules import STEP_RANGE, rules
from moeplane.controlplane.rl import idle
from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl import timeline_bins as tb
from moeplane.controlplane.rl.phases import PHASES, ROLES
from moeplane.controlplane.rl.step_window import MAX_STEPS, step_window
from moeplane.controlplane.rl.trace import chrome_trace
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store import rl_steps
from moeplane.controlplane.store.queries import require_job
from moeplane.controlplane.store.rl_columns import read_timeline_columns

router = APIRouter(prefix="/api/v1/jobs/{job_id}/rl", tags=["rl"])
RESPONSES = NOT_FOUND | BAD

#: what every RL read refuses (422) though each field is valid
RL_RULES = rules(STEP_RANGE, f"a step range holds at most {MAX_STEPS} steps")
StepStart = Annotated[int | None, Query(ge=0, le=MAX_STEP, description="from this step, inclusive")]
StepEnd = Annotated[int | None, Query(ge=1, le=MAX_STEP, description="to this step, exclusive")]
Limit = Annotated[int, Query(ge=1, le=store_rl.MAX_SPANS, description="most spans read")]


def step_range(engine, job_id: str, step_start: int | None, step_end: int | None) -> tuple[int, int]:
    """The [start, end) steps to read (:func:`step_window`); raises ValueError (422) for a bad range."""
    require_job(engine, job_id)
    newest = store_rl.latest_step(engine, job_id) if step_start is None and step_end is None else None
    return step_window(step_start, step_end, newest)


class SpanColumns(BaseModel):
    """Spans as columns (row i is one span); times unix seconds."""

    job_id: str
    step_start: int
    step_end: int
    count: int
    truncated: bool
    step: list[int]
    rank: list[int]
    node: list[str]
    role: list[str]
    phase: list[str]
    version: list[int]
    start: list[float]
    end: list[float]
    tokens: list[int]


def _read(engine, job_id, step_start, step_end, limit):
    lo, hi = step_range(engine, job_id, step_start, step_end)
    return lo, hi, store_rl.read_spans(engine, job_id, lo, hi, limit=limit)


@router.get("/spans", response_model=SpanColumns, responses=RESPONSES,
            openapi_extra=RL_RULES)
async def spans(engine: EngineDep, job_id: JobId, step_start: StepStart = None, step_end: StepEnd = None,
                limit: Limit = 100_000) -> dict:
    lo, hi, s = await asyncio.to_thread(_read, engine, job_id, step_start, step_end, limit)
    return {
        "job_id": job_id, "step_start": lo, "step_end": hi, "count": len(s), "truncated": len(s) >= limit,
        "step": s.step.tolist(), "rank": s.rank.tolist(), "node": [str(n) for n in s.node],
        "role": [ROLES[c] for c in s.role.tolist()], "phase": [PHASES[c] for c in s.phase.tolist()],
        "version": s.version.tolist(), "start": s.start.tolist(), "end": s.end.tolist(),
        "tokens": s.tokens.tolist(),
    }


class WeightSyncOut(BaseModel):
    step: int
    rank: int
    node_id: str
    from_version: int
    to_version: int
    bytes: int
    start_ts: float
    pause_s: float
    transfer_s: float
    resume_s: float
    gb_per_s: float | None


@router.get("/syncs", response_model=list[WeightSyncOut], responses=RESPONSES,
            openapi_extra=RL_RULES)
async def syncs(engine: EngineDep, job_id: JobId, step_start: StepStart = None,
                step_end: StepEnd = None) -> list[dict]:
    def read():
        lo, hi = step_range(engine, job_id, step_start, step_end)
        return store_rl.read_syncs(engine, job_id, lo, hi)

    rows = await asyncio.to_thread(read)
    for r in rows:
        r["gb_per_s"] = r["bytes"] / r["transfer_s"] / 1e9 if r["transfer_s"] > 0 else None
    return rows


class BatchOut(BaseModel):
    step: int
    rank: int
    node_id: str
    trained_version: int
    samples: int
    lag_min: int
    lag_mean: float
    lag_max: int
    bound: int
    dropped: int
    partial: int
    ts: float


@router.get("/batches", response_model=list[BatchOut], responses=RESPONSES,
            openapi_extra=RL_RULES)
async def batches(engine: EngineDep, job_id: JobId, step_start: StepStart = None,
                  step_end: StepEnd = None) -> list[dict]:
    def read():
        lo, hi = step_range(engine, job_id, step_start, step_end)
        return store_rl.read_batches(engine, job_id, lo, hi)

    return await asyncio.to_thread(read)


class IdleOut(BaseModel):
    """The idle analysis (moeplane.controlplane.rl.idle): ``summary`` per job; per step
    (index s of ``steps``) the window, bottleneck and device-seconds by category and idle
    cause; per device (index d of ``ranks``) and step, idle seconds ``idle[s][d]``."""

    job_id: str
    step_start: int
    step_end: int
    summary: dict
    causes: list[str]
    steps: list[int]
    ranks: list[int]
    roles: list[str]
    wall_s: list[float]
    bottleneck: list[str | None]
    tail_ratio: list[float | None]
    productive_s: list[float]
    sync_s: list[float]
    switch_s: list[float]
    idle_by_cause_s: list[list[float]]
    idle: list[list[float]]


@router.get("/idle", response_model=IdleOut, responses=RESPONSES,
            openapi_extra=RL_RULES)
async def idle_analysis(engine: EngineDep, job_id: JobId, step_start: StepStart = None,
                        step_end: StepEnd = None) -> dict:
    def run():
        lo, hi, s = _read(engine, job_id, step_start, step_end, store_rl.MAX_SPANS)
        return lo, hi, idle.analyze(s)

    lo, hi, rep = await asyncio.to_thread(run)
    tails = idle.step_tail_ratios(rep)
    return {
        "job_id": job_id, "step_start": lo, "step_end": hi, "summary": rep.summary(),
        "causes": list(idle.CAUSES), "steps": rep.steps.tolist(), "ranks": rep.ranks.tolist(),
        "roles": [ROLES[c] for c in rep.roles.tolist()], "wall_s": rep.wall.tolist(),
        "bottleneck": [idle.BOTTLENECKS[b] if b >= 0 else None for b in rep.bottleneck.tolist()],
        "tail_ratio": [None if not np.isfinite(x) else float(x) for x in tails],
        "productive_s": rep.productive.sum(axis=1).tolist(), "sync_s": rep.sync.sum(axis=1).tolist(),
        "switch_s": rep.switch.sum(axis=1).tolist(), "idle_by_cause_s": rep.idle_cause.sum(axis=1).tolist(),
        "idle": rep.idle.tolist(),
    }


class TimelineBins(BaseModel):
    """The range's spans binned device x time (:mod:`moeplane.controlplane.rl.timeline_bins`):
    row d is rank ``ranks[d]`` (-1: the job's per-step timers) of role ``roles[d]``; bin b
    covers [t0 + b*width_s, t0 + (b+1)*width_s) (unix s); ``dominant[d][b]`` indexes ``phases``
    (the phase with the most seconds in that cell; -1: no span); ``busy_s[d][b]`` the seconds of
    every phase in it (overlapping spans both count)."""

    job_id: str
    step_start: int
    step_end: int
    spans: int
    t0: float
    width_s: float
    bins: int
    phases: list[str]
    ranks: list[int]
    roles: list[str]
    dominant: list[list[int]]
    busy_s: list[list[float]]


Bins = Annotated[int, Query(ge=1, le=5_000, description="time bins over the range")]


@router.get("/timeline", response_model=TimelineBins, responses=RESPONSES,
            openapi_extra=RL_RULES)
async def timeline(engine: EngineDep, job_id: JobId, step_start: StepStart = None, step_end: StepEnd = None,
                   bins: Bins = 600) -> dict:
    """A timeline of any size: the spans of the range binned per device into ``bins`` equal
    time bins (a column read and numpy; for one row per span, see ``/spans``)."""

    def run():
        lo, hi = step_range(engine, job_id, step_start, step_end)
        cols = read_timeline_columns(engine, job_id, lo, hi)
        grid = tb.grid_over(cols.start, cols.end, bins)
        return lo, hi, cols, grid, tb.bin_spans(cols.device, cols.phase, cols.start, cols.end, grid,
                                                devices=cols.ranks.size)

    lo, hi, cols, grid, seconds = await asyncio.to_thread(run)
    return {
        "job_id": job_id, "step_start": lo, "step_end": hi, "spans": int(cols.phase.size), "t0": grid.t0,
        "width_s": grid.width, "bins": grid.bins, "phases": list(PHASES), "ranks": cols.ranks.tolist(),
        "roles": [ROLES[c] for c in cols.roles.tolist()], "dominant": tb.dominant(seconds).tolist(),
        "busy_s": seconds.sum(axis=2).tolist(),
    }


class StepPhases(BaseModel):
    """The range per step and device from the phase seconds kept at ingest (no span read;
    :mod:`moeplane.controlplane.rl.step_phases`): ``steps`` [S] ascending; column d is rank
    ``ranks[d]`` (-1: the job's per-step timers) of role ``roles[d]``; ``seconds[s][d][p]`` the
    seconds of ``phases[p]`` (the sum of the spans' durations), null where the device has no
    span in the step; ``dominant[s][d]`` the phase with the most seconds (-1: no span);
    ``wall_s[s]`` the step's first start to its last end over every device; ``idle_s[s][d]``
    that wall minus the device's phase seconds (at least 0; null: no span)."""

    job_id: str
    step_start: int
    step_end: int
    spans: int
    phases: list[str]
    steps: list[int]
    ranks: list[int]
    roles: list[str]
    wall_s: list[float]
    dominant: list[list[int]]
    idle_s: list[list[float | None]]
    seconds: list[list[list[float] | None]]


@router.get("/step-phases", response_model=StepPhases, responses=RESPONSES,
            openapi_extra=RL_RULES)
async def step_phases(engine: EngineDep, job_id: JobId, step_start: StepStart = None,
                      step_end: StepEnd = None) -> dict:
    """Phase seconds per step and device, read from the summary kept at ingest (what the RL
    page draws for a range too long for one bar per span)."""

    def run():
        lo, hi = step_range(engine, job_id, step_start, step_end)
        return lo, hi, sp.grid(*rl_steps.read(engine, job_id, lo, hi))

    lo, hi, g = await asyncio.to_thread(run)
    top, _ = g.dominant()
    idle_s = g.idle()
    seconds = [[row if here else None for row, here in zip(step_rows, present, strict=True)]
               for step_rows, present in zip(g.seconds.tolist(), g.present.tolist(), strict=True)]
    return {
        "job_id": job_id, "step_start": lo, "step_end": hi, "spans": g.spans, "phases": list(PHASES),
        "steps": g.steps.tolist(), "ranks": g.ranks.tolist(), "roles": [ROLES[c] for c in g.roles.tolist()],
        "wall_s": g.wall.tolist(), "dominant": top.tolist(),
        "idle_s": np.where(g.present, idle_s, None).tolist(), "seconds": seconds,
    }


@router.get("/trace", responses=RESPONSES | {200: {"description": "Chrome trace JSON (traceEvents)"}},
            openapi_extra=RL_RULES)
async def trace(engine: EngineDep, job_id: JobId, step_start: StepStart = None, step_end: StepEnd = None,
                limit: Limit = 1_000_000) -> dict:
    """The spans as Chrome-trace / Perfetto JSON: pid = node, tid = rank, ``ph: "X"``."""
    _lo, _hi, s = await asyncio.to_thread(_read, engine, job_id, step_start, step_end, limit)
    return chrome_trace(s, job_id)
