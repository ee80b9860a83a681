"""Identical history reads within ``ttl_s`` share one computation and one rendering.

Fifty dashboard readers of one job ask the same few history pages over and over; each page
costs the server ~35 ms of CPU (store query, aggregation, validation, JSON), so on two cores
the reads queued: p50 2.1 s, p99 3.6 s with 50 readers while the job ingested, against
0.03/0.11 s for one reader (docs/bench-history-load.md). Here the first request for a
(path, query) starts the work in a task of its own (a reader that goes away does not cancel it
for the others); every request for the same key until ``ttl_s`` after it started gets the same
rendered bytes. A page is therefore at most ``ttl_s`` older than the store. Errors are not
kept: each request after a failure tries again. Used behind authorization (in the handlers),
so a cached page is only served to a caller the route admits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable

from fastapi.responses import Response
from pydantic import BaseModel


class ReadCache:
    """``ttl_s``: how long a rendered page is served (s); ``max_entries``: pages kept."""

    def __init__(self, ttl_s: float = 1.0, max_entries: int = 512, clock: Callable[[], float] = time.monotonic):
        if ttl_s < 0 or max_entries < 1:
            raise ValueError(f"ttl_s >= 0 and max_entries >= 1, got {ttl_s}, {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._pages: dict[Hashable, tuple[float, asyncio.Task]] = {}
        self.computed = 0  # pages computed (for tests and benchmarks)

    async def json(self, key: Hashable, compute: Callable[[], Awaitable[dict]], model: type[BaseModel]) -> Response:
        """The page ``compute()`` returns, validated by ``model`` and rendered as JSON, shared
        with every request for ``key`` within ``ttl_s``."""
        now = self.clock()
        entry = self._pages.get(key)
        if entry is None or entry[0] <= now or (entry[1].done() and entry[1].exception() is not None):
            if len(self._pages) >= self.max_entries:
                self._evict(now)
            entry = (now + self.ttl_s, asyncio.ensure_future(self._render(compute, model)))
            self._pages[key] = entry
            self.computed += 1
        body = await asyncio.shield(entry[1])
        return Response(body, media_type="application/json")

    @staticmethod
    async def _render(compute: Callable[[], Awaitable[dict]], model: type[BaseModel]) -> bytes:
        return model.model_validate(await compute()).model_dump_json().encode()

    def _evict(self, now: float) -> None:
        for key in [k for k, (until, task) in self._pages.items() if until <= now and task.done()]:
            task = self._pages.pop(key)[1]
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" warning
        while len(self._pages) >= self.max_entries:  # all fresh: drop the oldest
            self._pages.pop(next(iter(self._pages)))
