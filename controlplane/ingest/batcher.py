"""Group records from every stream into one transaction per batch; resolve futures on commit.

Acknowledgements wait for these futures, so an ack always means "durably committed".
The database work runs in a worker thread; the event loop never blocks on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Sequence

from moeplane.controlplane.store.records import LoadsRecord, SamplesRecord, SequencedRecord

log = logging.getLogger(__name__)


Done = Callable[[SequencedRecord, "bool | BaseException"], None]


class Batcher:
    """Single writer task. ``admit`` returns a future of "was it a duplicate?";
    ``admit_then`` calls back instead (no future and no loop callback per record).

    Args:
        write: stores a batch in one transaction; returns a duplicate flag per record.
        max_batch: most records per transaction.
        linger_s: after the first record of a batch, wait this long (seconds) for more unless
            ``max_batch`` arrive sooner: bigger transactions cost far less per record (group
            commit); acknowledgements wait at most this much longer.
        max_pending_bytes: array bytes (loads counts, sample values) admitted but not yet
            committed; ``admit`` waits while over it, so a slow store stops the streams'
            reads and gRPC flow control slows the agents instead of memory growing.
        samples_linger_s: while every waiting record is a device-samples frame, linger this
            long in all (seconds, >= ``linger_s``; None: 5 x ``linger_s``, 0.1 s by default);
            any other record ends the wait at once.
            1,024 nodes sampling at 1 Hz, each on its own phase, made ~25-frame transactions
            with ``linger_s`` alone, and a transaction's fixed cost (begin, claim, COPY,
            newest-frame upsert, commit: ~0.5 ms of ours and as much of PostgreSQL's) then
            outweighed the frames' own; telemetry acks wait up to this much longer.
    """

    def __init__(
        self,
        write: Callable[[Sequence[SequencedRecord]], list[bool]],
        *,
        max_batch: int = 512,
        linger_s: float = 0.02,
        max_pending_bytes: int = 64 << 20,
        samples_linger_s: float | None = None,
    ):
        self._write = write
        self._max_batch = max_batch
        if linger_s < 0:
            raise ValueError(f"linger_s: must be >= 0, got {linger_s}")
        self._linger_s = linger_s
        if samples_linger_s is None:
            samples_linger_s = 5 * linger_s
        if samples_linger_s < linger_s:
            raise ValueError(f"samples_linger_s: must be >= linger_s ({linger_s}), got {samples_linger_s}")
        self._samples_linger_s = samples_linger_s
        self._others = 0  # queued records that are not samples frames
        self._samples_only_wait = False  # lingering past linger_s: a non-sample record ends it
        self._full = asyncio.Event()
        self._ready = asyncio.Event()  # set while records wait
        if max_pending_bytes < 1:
            raise ValueError(f"max_pending_bytes: must be >= 1, got {max_pending_bytes}")
        self._max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        # (record, its array bytes, called with the duplicate flag or the error after commit)
        self._queue: collections.deque[tuple[SequencedRecord, int, Done]] = collections.deque()
        self._task: asyncio.Task | None = None
        self.committed = 0
        self.duplicates = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _put(self, record: SequencedRecord, size: int, done: Done) -> None:
        self._queue.append((record, size, done))
        self._ready.set()
        if type(record) is not SamplesRecord:
            self._others += 1
            if self._samples_only_wait:
                self._full.set()
        if len(self._queue) >= self._max_batch:
            self._full.set()

    async def admit(self, record: SequencedRecord) -> asyncio.Future:
        """Queue ``record`` once the pending bytes leave room (one record is always admitted).

        Waiters are served first come, first served, each woken only when its bytes fit;
        records without arrays never wait.
        """
        fut = asyncio.get_running_loop().create_future()
        await self.admit_then(record, _resolver(fut))
        return fut

    async def admit_then(self, record: SequencedRecord, done: Done) -> None:
        """Queue ``record`` once its bytes fit (as ``admit``); after its transaction
        ``done(record, duplicate)`` is called, or ``done(record, error)`` if it was not stored.
        ``done`` runs in the event loop and must not raise."""
        size = record_bytes(record)
        if size and (self._waiters or (self.pending_bytes and self.pending_bytes + size > self._max_pending_bytes)):
            room = asyncio.get_running_loop().create_future()
            self._waiters.append((size, room))
            try:
                await room
            except asyncio.CancelledError:
                if room.done() and not room.cancelled():  # its bytes were reserved: give back
                    self._release(size)
                raise
        else:
            self.pending_bytes += size
        self._put(record, size, done)

    def _release(self, size: int) -> None:
        self.pending_bytes -= size
        while self._waiters:
            want, room = self._waiters[0]
            if room.done():  # its waiter was cancelled
                self._waiters.popleft()
                continue
            if self.pending_bytes and self.pending_bytes + want > self._max_pending_bytes:
                break
            self._waiters.popleft()
            self.pending_bytes += want
            room.set_result(None)

    async def _write_singly(self, batch) -> list[bool | BaseException]:
        """Write each record in its own transaction; a failing one fails only itself."""
        out: list[bool | BaseException] = []
        for record, _size, _done in batch:
            try:
                out.append((await asyncio.to_thread(self._write, [record]))[0])
            except Exception as exc:  # noqa: BLE001 - nothing is acked for this record
                log.exception("store write failed for %s", type(record).__name__)
                out.append(exc)
        return out

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._ready.clear()
                await self._ready.wait()
            if self._linger_s and len(queue) < self._max_batch:
                self._full.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._linger_s)
            extra = self._samples_linger_s - self._linger_s
            if extra > 0 and not self._others and len(queue) < self._max_batch:
                self._full.clear()
                self._samples_only_wait = True
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), extra)
                finally:
                    self._samples_only_wait = False
            batch = [queue.popleft() for _ in range(min(len(queue), self._max_batch))]
            records = [r for r, _, _ in batch]
            self._others -= sum(type(r) is not SamplesRecord for r in records)
            try:
                results: list[bool | BaseException] = await asyncio.to_thread(self._write, records)
            except Exception:  # noqa: BLE001 - isolate the bad record: retry one by one
                log.exception("store write failed for a batch of %d records; retrying singly", len(batch))
                results = await self._write_singly(batch)
            released = 0
            for (record, size, done), d in zip(batch, results, strict=True):
                released += size
                if not isinstance(d, BaseException):
                    self.committed += not d
                    self.duplicates += d
                try:
                    done(record, d)
                except Exception:  # noqa: BLE001 - one bad callback must not stop the writer
                    log.exception("ingest callback failed")
            self._release(released)


def _resolver(fut: asyncio.Future) -> Done:
    def done(_record: SequencedRecord, result: bool | BaseException) -> None:
        if fut.done():
            return
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)
    return done


def record_bytes(record: SequencedRecord) -> int:
    """Array bytes a record holds while it waits for its commit."""
    if isinstance(record, LoadsRecord):
        return int(record.counts.nbytes)
    if isinstance(record, SamplesRecord):
        return int(record.values.nbytes)
    return 0
