"""Operator actions of the dashboard, run by the same executor as REST.

The dashboard's callbacks are synchronous (Flask under WSGI, on a2wsgi's worker threads); the
executor publishes on the bus, which lives on the server's asyncio loop. ``executor_plan_actions``
wraps :class:`moeplane.controlplane.controller.executor.Executor`'s plan steps (approve:
proposed → approved → pushed, published on ``plans.<job>``; reject: open → rejected) as plain
functions that run them on that loop with ``asyncio.run_coroutine_threadsafe`` and wait.

A plan action is ``(job_id, epoch) -> dict`` (the plan's summary after the action); it raises
``Conflict`` when the plan's state does not allow it and ``NotFound`` for an unknown plan.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy.engine import Engine

from moeplane.controlplane.controller.executor import Executor, reject_plan

PlanAction = Callable[[str, int], dict]

ACTION_TIMEOUT_S = 30.0


def executor_plan_actions(executor: Executor, loop: asyncio.AbstractEventLoop,
                          timeout_s: float = ACTION_TIMEOUT_S) -> tuple[PlanAction, PlanAction]:
    """(approve, reject) running ``executor``'s plan steps on ``loop`` (the bus's loop). Must
    not be called from ``loop``'s own thread."""

    def run(coro) -> dict:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def approve(job_id: str, epoch: int) -> dict:
        return run(executor.approve_plan(job_id, epoch))

    def reject(job_id: str, epoch: int) -> dict:
        return run(executor.reject_plan(job_id, epoch))

    return approve, reject


def store_reject(engine: Engine) -> PlanAction:
    """Reject without a server loop: the same store transition as the REST handler (rejecting
    publishes nothing)."""

    def reject(job_id: str, epoch: int) -> dict:
        return reject_plan(engine, job_id, epoch)

    return reject
