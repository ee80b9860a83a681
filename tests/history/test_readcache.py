"""ReadCache: identical reads within the TTL share one computation; a page expires after it;
a failure is not kept; a reader that goes away does not cancel the work for the others."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel

from moeplane.controlplane.api.readcache import ReadCache


class Page(BaseModel):
    n: int


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_identical_reads_share_one_computation_until_the_ttl():
    async def main():
        clock = Clock()
        cache = ReadCache(ttl_s=1.0, clock=clock)
        release = asyncio.Event()
        calls = []

        async def compute():
            calls.append(1)
            await release.wait()
            return {"n": len(calls)}

        readers = [asyncio.create_task(cache.json(("p", "q"), compute, Page)) for _ in range(50)]
        release.set()
        bodies = {r.body for r in await asyncio.gather(*readers)}
        assert bodies == {b'{"n":1}'} and len(calls) == 1
        other = await cache.json(("p", "other"), compute, Page)  # another query: its own page
        assert json.loads(other.body) == {"n": 2}
        clock.now += 1.0  # expired
        assert json.loads((await cache.json(("p", "q"), compute, Page)).body) == {"n": 3}
        assert cache.computed == 3

    asyncio.run(main())


def test_a_failure_is_not_kept():
    async def main():
        cache = ReadCache(ttl_s=60.0, clock=Clock())
        outcomes = iter([LookupError("job 'j' not found"), {"n": 7}])

        async def compute():
            outcome = next(outcomes)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        with pytest.raises(LookupError):
            await cache.json("k", compute, Page)
        assert json.loads((await cache.json("k", compute, Page)).body) == {"n": 7}

    asyncio.run(main())


def test_a_reader_going_away_does_not_cancel_the_others():
    async def main():
        cache = ReadCache(ttl_s=60.0, clock=Clock())
        release = asyncio.Event()

        async def compute():
            await release.wait()
            return {"n": 1}

        first = asyncio.create_task(cache.json("k", compute, Page))
        second = asyncio.create_task(cache.json("k", compute, Page))
        await asyncio.sleep(0)  # a yield, not a wait: both readers now await the shared task
        first.cancel()
        release.set()
        assert (await second).body == b'{"n":1}'
        assert first.cancelled()

    asyncio.run(main())
