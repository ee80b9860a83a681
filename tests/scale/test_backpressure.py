"""The batcher admits array bytes up to its budget; past it ``admit`` waits for commits, so a
slow store stops stream reads (gRPC flow control) instead of growing memory."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from moeplane.controlplane.ingest.batcher import Batcher, record_bytes
from moeplane.controlplane.store.records import LoadsRecord, MarkerRecord, SamplesRecord
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


def frame(seq: int) -> SamplesRecord:
    return SamplesRecord("n", seq, 1.0, ("n/gpu0",), ("util",), np.zeros((1, 1), np.float32))


def test_samples_frames_linger_together_until_another_record_arrives():
    """Frames alone wait up to samples_linger_s to share one transaction; a loads record
    arriving meanwhile is written at once, with the frames waiting before it."""
    batches: list[list[int]] = []

    def write(records):
        batches.append([r.seq for r in records])
        return [False] * len(records)

    async def scenario():
        b = Batcher(write, linger_s=0.005, samples_linger_s=60)
        b.start()
        try:
            frames = [await b.admit(frame(s)) for s in (1, 2, 3)]
            done, _ = await asyncio.wait(frames, timeout=0.3)
            assert not done and batches == []  # well past linger_s, still lingering
            urgent = await b.admit(loads(4))
            await asyncio.wait_for(asyncio.gather(urgent, *frames), 10)
            assert batches == [[1, 2, 3, 4]]
        finally:
            await b.stop()

    aio.run(scenario())


def test_samples_linger_ends_when_the_batch_is_full_and_after_samples_linger_s():
    batches: list[list[int]] = []

    def write(records):
        batches.append([r.seq for r in records])
        return [False] * len(records)

    async def scenario():
        b = Batcher(write, max_batch=2, linger_s=0.005, samples_linger_s=60)
        b.start()
        try:
            full = [await b.admit(frame(s)) for s in (1, 2)]
            await asyncio.wait_for(asyncio.gather(*full), 10)
            b2 = Batcher(write, linger_s=0.005, samples_linger_s=0.05)
            b2.start()
            try:
                await asyncio.wait_for(await b2.admit(frame(3)), 10)
            finally:
                await b2.stop()
            assert batches == [[1, 2], [3]]
        finally:
            await b.stop()

    aio.run(scenario())


@pytest.mark.parametrize(("kw", "name"), [({"linger_s": -1}, "linger_s"), ({"max_pending_bytes": 0}, "max_pending_bytes"),
                                          ({"linger_s": 0.1, "samples_linger_s": 0.05}, "samples_linger_s")])
def test_bad_settings_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=name):
        Batcher(lambda r: [False] * len(r), **kw)
