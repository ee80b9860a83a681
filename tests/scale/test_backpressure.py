"""The batcher admits array bytes up to its budget; past it ``admit`` waits for commits, so a
slow store stops stream reads (gRPC flow control) instead of growing memory."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from controlplane.ingest.batcher import Batcher, record_bytes
from controlplane.store.records import LoadsRecord, MarkerRecord
from tests import aio


def loads(seq: int) -> LoadsRecord:
    return LoadsRecord("n", seq, "job", seq, 1.0, (0,), (), np.zeros((4, 8), np.int64))


def test_admit_waits_for_room_and_resumes_after_commit():
    gate = threading.Event()
    written: list[int] = []

    def write(records):
        gate.wait(30)
        written.extend(r.seq for r in records)
        return [False] * len(records)

    async def scenario():
        b = Batcher(write, linger_s=0, max_pending_bytes=2 * record_bytes(loads(1)))
        b.start()
        try:
            f1 = await b.admit(loads(1))
            f2 = await b.admit(loads(2))
            third = asyncio.create_task(b.admit(loads(3)))
            marker = await asyncio.wait_for(b.admit(MarkerRecord("n", 9)), 5)  # no bytes: room
            done, _ = await asyncio.wait([third], timeout=0.3)
            assert not done and b.pending_bytes == 2 * 256  # full: the third waits
            gate.set()
            await asyncio.wait_for(asyncio.gather(f1, f2, marker), 10)
            f3 = await asyncio.wait_for(third, 10)
            await asyncio.wait_for(f3, 10)
            assert b.pending_bytes == 0
        finally:
            gate.set()
            await b.stop()

    aio.run(scenario())
    assert sorted(written) == [1, 2, 3, 9]


@pytest.mark.parametrize(("kw", "name"), [({"linger_s": -1}, "linger_s"), ({"max_pending_bytes": 0}, "max_pending_bytes")])
def test_bad_settings_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        Batcher(lambda r: [False] * len(r), **kw)
