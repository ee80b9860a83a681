"""ReadCache: identical reads share one computation; after ``ttl_s`` a page is still served
while one refresh runs in the background (no reader waits), up to ``max_stale_s``, after which
readers wait for the fresh page; a failure is not kept; a reader that goes away cancels nothing."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from pydantic import BaseModel

from moeplane.controlplane.api.readcache import ReadCache

WAIT_S = 30.0  # deadline of every wait on a worker thread


class Page(BaseModel):
    n: int


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Source:
    """A computation that counts its calls and, while ``gate`` is clear, blocks (in its worker
    thread) until the test sets it."""

    def __init__(self):
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self) -> dict:
        self.calls += 1
        self.entered.set()
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return {"n": self.calls}


def scripted(*outcomes):
    """A computation returning (or, for an exception, raising) ``outcomes`` one call after another."""
    left = iter(outcomes)

    def compute() -> dict:
        outcome = next(left)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return compute


async def body(cache: ReadCache, key, source) -> dict:
    return json.loads((await cache.json(key, source, Page)).body)


async def first_page(source) -> tuple[ReadCache, Clock]:
    """A cache (``ttl_s`` 1, ``max_stale_s`` 5, on a test clock) that has served ``source``'s
    first page, ``{"n": 1}``, under key "k"."""
    clock = Clock()
    cache = ReadCache(ttl_s=1.0, max_stale_s=5.0, clock=clock)
    assert await body(cache, "k", source) == {"n": 1}
    return cache, clock


def test_identical_reads_share_one_computation():
    async def main():
        cache = ReadCache(ttl_s=1.0, clock=Clock())
        source = Source()
        source.gate.clear()
        readers = [asyncio.create_task(cache.json(("p", "q"), source, Page)) for _ in range(50)]
        await asyncio.to_thread(source.entered.wait, WAIT_S)
        source.gate.set()
        bodies = {r.body for r in await asyncio.gather(*readers)}
        assert bodies == {b'{"n":1}'} and source.calls == 1
        assert await body(cache, ("p", "other"), source) == {"n": 2}  # another query: its own page
        assert cache.computed == 2

    asyncio.run(main())


def test_a_stale_page_is_served_while_one_refresh_runs():
    async def main():
        source = Source()
        cache, clock = await first_page(source)
        clock.now += 1.0  # past the TTL: served at once, one refresh starts
        source.gate.clear()
        source.entered.clear()
        served = [await body(cache, "k", source) for _ in range(20)]
        assert served == [{"n": 1}] * 20
        await asyncio.to_thread(source.entered.wait, WAIT_S)
        assert source.calls == 2  # one refresh for the 20 readers, none of whom waited on it
        source.gate.set()
        refresh = cache._pages["k"].refresh
        await refresh
        await asyncio.sleep(0)  # a yield, not a wait: the refresh's done-callback runs
        assert await body(cache, "k", source) == {"n": 2}
        assert cache.computed == 2

    asyncio.run(main())


def test_a_page_past_max_stale_is_not_served():
    async def main():
        source = Source()
        cache, clock = await first_page(source)
        clock.now += 5.0
        assert await body(cache, "k", source) == {"n": 2}  # waited for the fresh page

    asyncio.run(main())


def test_a_failure_is_not_kept():
    async def main():
        cache = ReadCache(ttl_s=60.0, max_stale_s=60.0, clock=Clock())
        compute = scripted(LookupError("job 'j' not found"), {"n": 7})
        with pytest.raises(LookupError):
            await cache.json("k", compute, Page)
        await asyncio.sleep(0)  # a yield, not a wait: the failed task's done-callback runs
        assert await body(cache, "k", compute) == {"n": 7}

    asyncio.run(main())


def test_a_failed_refresh_keeps_the_last_page_until_max_stale():
    async def main():
        compute = scripted({"n": 1}, LookupError("store unreachable"), LookupError("store unreachable"))
        cache, clock = await first_page(compute)
        clock.now += 2.0
        assert await body(cache, "k", compute) == {"n": 1}  # stale, served; its refresh fails
        with pytest.raises(LookupError):
            await cache._pages["k"].refresh
        await asyncio.sleep(0)  # a yield, not a wait: the failed task's done-callback runs
        clock.now += 3.0  # 5 s old: not served any more; the readers get the refresh's error
        with pytest.raises(LookupError):
            await cache.json("k", compute, Page)

    asyncio.run(main())


def test_a_reader_going_away_does_not_cancel_the_others():
    async def main():
        cache = ReadCache(ttl_s=60.0, max_stale_s=60.0, clock=Clock())
        source = Source()
        source.gate.clear()
        first = asyncio.create_task(cache.json("k", source, Page))
        second = asyncio.create_task(cache.json("k", source, Page))
        await asyncio.to_thread(source.entered.wait, WAIT_S)  # both readers await the shared work
        first.cancel()
        source.gate.set()
        assert (await second).body == b'{"n":1}'
        assert first.cancelled()

    asyncio.run(main())


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="ttl_s <= max_stale_s"):
        ReadCache(ttl_s=2.0, max_stale_s=1.0)
