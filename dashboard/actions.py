"""Operator actions of the dashboard, run through the same code as REST.

The dashboard's callbacks are synchronous (Flask under WSGI, on a2wsgi's worker threads); the
REST handlers and the bus live on the server's asyncio loop. ``rest_plan_actions`` wraps the
REST handlers of ``moeplane.controlplane.api.plans`` (approve: proposed → approved, push, publish the
PlacementPlan on ``plans.<job>``; reject: open → rejected) as plain functions that run them on
that loop with ``asyncio.run_coroutine_threadsafe`` and wait for the result.

A plan action is ``(job_id, epoch) -> dict`` (the plan's summary after the action); it raises
``Conflict`` when the plan's state does not allow it and ``NotFound`` for an unknown plan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy.engine import Engine

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.store import plans as P

PlanAction = Callable[[str, int], dict]

ACTION_TIMEOUT_S = 30.0


def rest_plan_actions(api, loop: asyncio.AbstractEventLoop,
                      timeout_s: float = ACTION_TIMEOUT_S) -> tuple[PlanAction, PlanAction]:
    """(approve, reject) running ``moeplane.controlplane.api.plans``'s handlers on ``loop``.

    ``api`` is the FastAPI app from ``create_api`` (its ``state.engine`` and ``state.bus`` are
    what the handlers use). Must not be called from ``loop``'s own thread.
    """
    from starlette.requests import Request

    from moeplane.controlplane.api import plans as rest

    def run(coro) -> dict:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def approve(job_id: str, epoch: int) -> dict:
        request = Request({"type": "http", "app": api})  # what the handler reads: app.state.bus
        return run(rest.approve(job_id=job_id, epoch=epoch, request=request, engine=api.state.engine))

    def reject(job_id: str, epoch: int) -> dict:
        return run(rest.reject(job_id=job_id, epoch=epoch, engine=api.state.engine))

    return approve, reject


def store_reject(engine: Engine) -> PlanAction:
    """Reject without a server loop: the same store transition as the REST handler (rejecting
    publishes nothing)."""

    def reject(job_id: str, epoch: int) -> dict:
        return P.transition(engine, job_id, epoch, Status.REJECTED,
                            detail="rejected by operator")

    return reject
