"""One simulated rank's ``NodeLocal.Attach`` stream to its node agent, kept alive.

Like the SDK's background sender: :meth:`RankLink.send` never blocks the step (a bounded queue;
the oldest report is dropped when the agent is away for long), and the stream is reopened with
backoff (hello again) when the agent restarts. Plans read from the stream go to ``on_plan``,
offload decisions to ``on_offload``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

import grpc

from moeplane.agents.backoff import Backoff
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class RankLink:
    def __init__(self, channel: grpc.aio.Channel, hello: pb.RankHello,
                 on_plan: Callable[[int, pb.PlacementPlan], None], *,
                 on_offload: Callable[[int, pb.OffloadDecision], None] | None = None,
                 max_queued: int = 1000, seed: int | None = None):
        self.stub = pb_grpc.NodeLocalStub(channel)
        self.hello = hello
        self.rank = hello.rank
        self.on_plan = on_plan
        self.on_offload = on_offload
        self.queue: deque[pb.RankMessage] = deque(maxlen=max_queued)
        self.ready = asyncio.Event()  # set: the queue gained a message
        self.empty = asyncio.Event()  # set: everything queued was written
        self.empty.set()
        self.dropped = 0
        self.rejected = 0
        self.attached = asyncio.Event()
        self.backoff = Backoff(0.1, 2.0, seed)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"rank-{self.rank}")

    def send(self, msg: pb.RankMessage) -> None:
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(msg)
        self.empty.clear()
        self.ready.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until everything queued was written (or ``timeout``); True when drained."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.empty.wait(), timeout)
        return not self.queue

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            call = self.stub.Attach()
            try:
                await call.write(pb.RankMessage(hello=self.hello))
                reader = asyncio.create_task(self._read(call))
                self.attached.set()
                self.backoff.reset()
                try:
                    await self._write(call, reader)
                finally:
                    reader.cancel()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
                log.debug("rank %d: stream to agent lost: %s", self.rank, exc)
            finally:
                self.attached.clear()
                call.cancel()
            await asyncio.sleep(self.backoff.next_delay())

    async def _write(self, call, reader: asyncio.Task) -> None:
        while not reader.done():
            if not self.queue:
                self.ready.clear()
                waiter = asyncio.create_task(self.ready.wait())
                await asyncio.wait([waiter, reader], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            await call.write(self.queue[0])
            self.queue.popleft()
            if not self.queue:
                self.empty.set()
        reader.result()  # re-raise why the stream ended

    async def _read(self, call) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise asyncio.InvalidStateError("agent closed the stream")
            body = msg.WhichOneof("body")
            if body == "plan":
                self.on_plan(self.rank, msg.plan)
            elif body == "offload" and self.on_offload is not None:
                self.on_offload(self.rank, msg.offload)
            elif body == "ack" and msg.ack.code:
                self.rejected += 1
                log.warning("rank %d: agent rejected step %d: %s", self.rank, msg.ack.seq,
                            msg.ack.message)
