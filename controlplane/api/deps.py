"""Dependency aliases shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy.engine import Engine

from moeplane.controlplane.controller.executor import Executor
from moeplane.controlplane.domain.bounds import MAX_INT
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.controlplane.store.queries import MAX_LIMIT, Range


async def get_engine(request: Request) -> Engine:
    """``async``, as every dependency here: FastAPI calls it on the event loop; a plain ``def``
    would cost every request a round trip through the worker threads (under load, a wait for a
    thread and the GIL)."""
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(get_engine)]

# Bounds of every number a query may carry: what the store's columns hold (BIGINT steps,
# float seconds), so that no parameter reaches the database as an overflow (a 500). Integers
# stop at MAX_INT, 2**53 - 1, the largest a JSON number carries exactly (RFC 7493): past it, a client
# that parses numbers as doubles rounds a value over the bound down onto it.
MAX_STEP = MAX_INT
MAX_TIME = 1e11  # unix seconds, year 5138


async def get_placements(request: Request) -> PlacementSource:
    """The process's placement source (shared with the controller and the dashboard)."""
    return request.app.state.placements


PlacementsDep = Annotated[PlacementSource, Depends(get_placements)]


async def get_executor(request: Request) -> Executor:
    """The executor of decisions (approve → push → publish on the app's bus)."""
    state = request.app.state
    if getattr(state, "executor", None) is None:
        state.executor = Executor(state.engine, state.bus)
    return state.executor


ExecutorDep = Annotated[Executor, Depends(get_executor)]


async def get_range(
    start: Annotated[float | None, Query(description="from this unix time (s), inclusive", ge=0, le=MAX_TIME)] = None,
    end: Annotated[float | None, Query(description="to this unix time (s), exclusive", ge=0, le=MAX_TIME)] = None,
    step_start: Annotated[int | None, Query(description="from this step, inclusive", ge=0, le=MAX_STEP)] = None,
    step_end: Annotated[int | None, Query(description="to this step, exclusive", ge=0, le=MAX_STEP)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="most rows returned")] = 1000,
) -> Range:
    return Range(start=start, end=end, step_start=step_start, step_end=step_end, limit=limit)


RangeDep = Annotated[Range, Depends(get_range)]
