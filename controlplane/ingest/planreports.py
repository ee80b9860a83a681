"""Coalesce agents' plan reports into one store transaction per (job, epoch) batch.

When a plan goes out to 1,024 agents, 1,024 reports of it come back within milliseconds;
recorded one transaction each (plan row lock, membership read, event insert, two counts) they
would take most of the server's time while the plan is still being sent. The first
report of a (job, epoch) opens a window that closes once no report of that plan arrived for
``quiet_s`` (its fan-out is over), after ``linger_s`` at the most, or at ``max_batch`` reports;
then one ``plans.record_reports`` call in a worker thread records the whole batch,
and each caller gets its own report's outcome (or exception) back. One batch of a plan records
at a time: reports that arrive meanwhile join the open batch and go in the next transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy.engine import Engine

from moeplane.controlplane.store import plans

Report = tuple[str, str, int, str]  # (node_id, state, step, error)


class _Batch:
    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.futures: list[asyncio.Future] = []
        self.full = asyncio.Event()
        self.arrived = asyncio.Event()  # set by each report (and when full)


class PlanReports:
    """Batches plan reports per (job, epoch); one worker-thread transaction per batch.

    Args:
        engine: the store.
        clock: wall clock for event timestamps (seconds since the epoch); None: time.time.
        quiet_s: close a batch once no report of its plan arrived for this long (seconds). A
            plan's reports come back while it is still being sent (to 1,024 agents that takes
            150-250 ms on 2 cores, reports arriving every few ms); waiting for the quiet puts
            them in one or two transactions AFTER the fan-out, so neither their database work
            nor their acks compete with the plan's writes, while a small job's reports are
            recorded ``quiet_s`` after the last one (docs/bench-fanout.md).
        linger_s: after the first report of a batch, close it after this long (seconds) even
            if reports keep coming; a report's ack waits at most this much longer than its own
            transaction.
        max_batch: most reports per transaction.
    """

    def __init__(self, engine: Engine, clock: Callable[[], float] | None = None, *,
                 quiet_s: float = 0.05, linger_s: float = 1.0, max_batch: int = 1024):
        if quiet_s < 0:
            raise ValueError(f"quiet_s: must be >= 0, got {quiet_s}")
        if linger_s < 0:
            raise ValueError(f"linger_s: must be >= 0, got {linger_s}")
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        self.engine = engine
        self.clock = clock
        self.quiet_s = quiet_s
        self.linger_s = linger_s
        self.max_batch = max_batch
        self._open: dict[tuple[str, int], _Batch] = {}  # batches still taking reports
        # [lock held while a batch of the plan records, batches using it]
        self._running: dict[tuple[str, int], list] = {}
        self._tasks: set[asyncio.Task] = set()
        self.transactions = 0  # batches recorded (for tests and benchmarks)
        self.reports = 0

    async def record(self, job_id: str, epoch: int, node_id: str, state: str, step: int,
                     error: str = "") -> dict:
        """``plans.record_report``'s result for this report, recorded with others of the same
        plan; raises what it would raise (NotFound, PermissionError, ValueError)."""
        key = (job_id, epoch)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch()
            task = asyncio.create_task(self._flush(key, batch), name=f"plan-reports-{job_id}-{epoch}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        fut = asyncio.get_running_loop().create_future()
        batch.reports.append((node_id, state, step, error))
        batch.futures.append(fut)
        if len(batch.reports) >= self.max_batch:
            del self._open[key]  # later reports start the next batch
            batch.full.set()
        batch.arrived.set()
        return await fut

    async def _flush(self, key: tuple[str, int], batch: _Batch) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger_s
        while not batch.full.is_set():
            left = deadline - loop.time()
            if left <= 0:
                break
            batch.arrived.clear()
            try:
                await asyncio.wait_for(batch.arrived.wait(), min(self.quiet_s, left))
            except TimeoutError:
                break  # quiet: this plan's reports are in
        # one transaction of a plan at a time (they would queue on its row lock anyway):
        # reports arriving while the previous one runs join this batch (group commit)
        gate = self._running.get(key)
        if gate is None:
            gate = self._running[key] = [asyncio.Lock(), 0]
        gate[1] += 1
        try:
            async with gate[0]:
                if self._open.get(key) is batch:
                    del self._open[key]
                await self._record(key, batch)
        finally:
            gate[1] -= 1
            if gate[1] == 0:
                del self._running[key]

    async def _record(self, key: tuple[str, int], batch: _Batch) -> None:
        try:
            outcomes = await asyncio.to_thread(
                plans.record_reports, self.engine, key[0], key[1], batch.reports, self.clock
            )
        except BaseException as exc:  # the transaction failed: every report of it failed
            for fut in batch.futures:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        self.transactions += 1
        self.reports += len(batch.reports)
        for fut, outcome in zip(batch.futures, outcomes, strict=True):
            if fut.done():  # its caller went away (stream closed)
                continue
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
