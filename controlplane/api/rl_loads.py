"""RL router, expert loads by phase: an MoE policy's loads during rollout beside those during
training, summed per phase over a step range [step_start, step_end).

The range rules are the other RL reads' (:func:`moeplane.controlplane.api.rl.step_range`): a
range with step_end <= step_start, or wider than ``MAX_STEPS``, is refused with 422; without
one, the newest ``DEFAULT_STEPS`` steps with phase loads are read.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from pydantic import BaseModel

from moeplane.controlplane.api.deps import EngineDep
from moeplane.controlplane.api.rl import RESPONSES, RL_RULES, StepEnd, StepStart, step_range
from moeplane.controlplane.api.routes import JobId
from moeplane.controlplane.rl.loads import summarize
from moeplane.controlplane.store import rl_loads

router = APIRouter(prefix="/api/v1/jobs/{job_id}/rl", tags=["rl"])


class PhaseLoadsOut(BaseModel):
    """A phase's loads summed over the range: ``counts[l][e]`` tokens routed to expert e of
    MoE layer l; ``max_over_mean[l]`` the busiest expert's count over the mean expert's in
    layer l (1.0: even)."""

    phase: str
    steps: int
    ranks: int
    rows: int
    tokens: int
    counts: list[list[int]]
    share: list[list[float]]
    max_over_mean: list[float]
    max_over_mean_avg: float


class RLLoadsOut(BaseModel):
    job_id: str
    step_start: int
    step_end: int
    layers: int
    experts: int
    phases: list[PhaseLoadsOut]


def read(engine, job_id: str, step_start: int | None, step_end: int | None) -> dict:
    """The response body (see :class:`RLLoadsOut`)."""
    if step_start is None and step_end is None:  # the newest steps with phase loads
        newest = rl_loads.latest_step(engine, job_id)
        if newest is not None:
            step_end = int(newest) + 1
    lo, hi = step_range(engine, job_id, step_start, step_end)  # 404 for an unknown job
    sums = rl_loads.sum_by_phase(engine, job_id, lo, hi)
    phases = summarize(sums.phases, sums.counts)
    layers, experts = sums.counts.shape[1:] if len(phases) else (0, 0)
    return {
        "job_id": job_id, "step_start": lo, "step_end": hi, "layers": int(layers), "experts": int(experts),
        "phases": [p | {"steps": int(st), "ranks": int(rk), "rows": int(n), "counts": p["counts"].tolist(),
                        "share": p["share"].tolist(), "max_over_mean": p["max_over_mean"].tolist()}
                   for p, st, rk, n in zip(phases, sums.steps, sums.ranks, sums.rows, strict=True)],
    }


@router.get("/loads", response_model=RLLoadsOut, responses=RESPONSES, openapi_extra=RL_RULES)
async def phase_loads(engine: EngineDep, job_id: JobId, step_start: StepStart = None,
                      step_end: StepEnd = None) -> dict:
    """Expert loads by RL phase (rollout beside training), summed over the step range."""
    return await asyncio.to_thread(read, engine, job_id, step_start, step_end)
