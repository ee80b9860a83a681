"""Identical history reads share one computation and one rendering, and no reader waits on a
refresh while a recent page exists (stale-while-revalidate).

Fifty dashboard readers of one job ask the same few history pages over and over. Each page
costs the server tens of ms of CPU (store query, aggregation, validation, JSON). With a plain
1-s cache, every page expired at once each second and the readers that came then waited on
its recompute, queued behind every other request on a shared CPU: p99 3.8 s against a p50 of
0.5 s (docs/bench-history-load.md). Here, per key (path, query):

- the first request starts the computation and waits for it (there is nothing to serve yet);
- a page younger than ``ttl_s`` is served as it is;
- a page between ``ttl_s`` and ``max_stale_s`` old is served as it is, and one refresh starts
  in the background (one per key at a time);
- a page ``max_stale_s`` old or older is not served: the request waits for the refresh.

A page's age counts from when its computation started, so a served page never reflects the
store as of more than ``max_stale_s`` ago. The computation (query, validation, JSON) runs in
one worker thread, off the event loop, and belongs to no request: a reader that goes away
cancels nothing. Errors are not kept: the readers waiting on a failed computation get its
error, and the next request starts another. Used behind authorization (in the handlers), so a
cached page is only served to a caller the route admits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from fastapi.responses import Response
from pydantic import BaseModel


@dataclass
class _Entry:
    started: float = 0.0  # when the computation of ``body`` started (clock s)
    body: bytes | None = None  # the newest rendered page, None before the first
    refresh: asyncio.Task | None = None  # the computation under way, if any


class ReadCache:
    """``ttl_s``: age (s) up to which a page is served without a refresh; ``max_stale_s``: age
    from which a request waits for a fresh page; ``max_entries``: pages kept."""

    def __init__(self, ttl_s: float = 1.0, max_stale_s: float = 5.0, max_entries: int = 512,
                 clock: Callable[[], float] = time.monotonic):
        if not 0 <= ttl_s <= max_stale_s or max_entries < 1:
            raise ValueError(f"0 <= ttl_s <= max_stale_s and max_entries >= 1, got {ttl_s}, {max_stale_s}, "
                             f"{max_entries}")
        self.ttl_s = ttl_s
        self.max_stale_s = max_stale_s
        self.max_entries = max_entries
        self.clock = clock
        self._pages: dict[Hashable, _Entry] = {}
        self.computed = 0  # computations started (for tests and benchmarks)

    async def json(self, key: Hashable, compute: Callable[[], dict], model: type[BaseModel]) -> Response:
        """The page ``compute()`` returns (called in a worker thread), validated by ``model``
        and rendered as JSON; shared with every request for ``key`` as described above."""
        now = self.clock()
        entry = self._pages.get(key)
        if entry is None:
            if len(self._pages) >= self.max_entries:
                self._evict()
            entry = self._pages[key] = _Entry()
        age = now - entry.started
        if entry.body is not None and age < self.ttl_s:
            return _json(entry.body)
        task = entry.refresh or self._start(entry, compute, model, now)
        if entry.body is not None and age < self.max_stale_s:
            return _json(entry.body)
        return _json(await asyncio.shield(task))

    def _start(self, entry: _Entry, compute: Callable[[], dict], model: type[BaseModel], now: float) -> asyncio.Task:
        def render() -> bytes:
            return model.model_validate(compute()).model_dump_json().encode()

        def finished(task: asyncio.Task) -> None:
            entry.refresh = None
            if not task.cancelled() and task.exception() is None:
                entry.started, entry.body = now, task.result()

        entry.refresh = asyncio.ensure_future(asyncio.to_thread(render))
        entry.refresh.add_done_callback(finished)
        self.computed += 1
        return entry.refresh

    def _evict(self) -> None:
        """Drop the oldest pages, down to 3/4 of the bound (a computation under way goes on for
        the requests that wait on it)."""
        oldest = sorted(self._pages, key=lambda k: self._pages[k].started)
        for key in oldest[: len(self._pages) - self.max_entries * 3 // 4]:
            del self._pages[key]


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")
