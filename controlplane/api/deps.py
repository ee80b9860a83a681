"""Dependency aliases shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from sqlalchemy.engine import Engine

from moeplane.controlplane.store.queries import MAX_LIMIT, Range


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(get_engine)]


def get_range(
    start: Annotated[float | None, Query(description="from this unix time (s), inclusive", ge=0)] = None,
    end: Annotated[float | None, Query(description="to this unix time (s), exclusive", ge=0)] = None,
    step_start: Annotated[int | None, Query(description="from this step, inclusive", ge=0)] = None,
    step_end: Annotated[int | None, Query(description="to this step, exclusive", ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="most rows returned")] = 1000,
) -> Range:
    return Range(start=start, end=end, step_start=step_start, step_end=step_end, limit=limit)


RangeDep = Annotated[Range, Depends(get_range)]
