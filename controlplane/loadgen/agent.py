"""One emulated node agent: a grpc.aio bidirectional stream to the control plane.

Sends hello, then on a fixed schedule the loads of every finished step (per rank or per node),
the step statistics, and one device-sample frame per sampling interval. Waits when
``max_in_flight`` messages are unacknowledged (the control plane's backpressure reaches it
through that window and gRPC flow control). Reconnects when the stream breaks, resuming
after the highest seq the control plane has stored, until the run's end.

Plans are rebuilt like a real agent does: each stream keeps a ``PlanReceiver`` that turns a
full plan or a delta into the full ``phy2log[L, G*S]`` (numpy) and keeps it as the next base; a
delta it cannot rebuild is reported FAILED. ``stats.plans`` gets ``(node, epoch, unix time when
rebuilt, serialized plan bytes, delta?)`` per plan.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import numpy as np

from moeplane.controlplane.loadgen import messages as m
from moeplane.controlplane.loadgen.config import LoadgenConfig
from moeplane.controlplane.loadgen.stats import Stats
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.plan_codec import PlanReceiver

DRAIN_S = 15.0


class _Broken(Exception):
    """The stream ended; reconnect."""


class EmulatedAgent:
    """Node ``n`` of ``cfg``. ``run`` returns when the run is over and acks are drained."""

    def __init__(self, cfg: LoadgenConfig, n: int, stats: Stats, pool: list[pb.NDArray],
                 channel_for: Callable[[str], grpc.aio.Channel], *, t0: float,
                 stop: asyncio.Event | None = None, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.n = n
        self.node_id = cfg.node_id(n)
        self.stats = stats
        self.pool = pool
        self.channel_for = channel_for
        self.t0 = t0
        self.clock = clock
        self.end = t0 + cfg.duration_s
        self.stop = stop or asyncio.Event()  # set: end the run now (e.g. SIGTERM)
        self.rng = np.random.default_rng(cfg.seed * 100_003 + n)
        self.seq = 0
        # seq -> (kind, sent perf_counter, items, holds a window slot)
        self.pending: dict[int, tuple[str, float, int, bool]] = {}
        self.idle = asyncio.Event()
        self.acked: list[int] = []
        stats.acked_seqs[self.node_id] = self.acked
        # schedule: steps finish together; sampling rounds spread over the interval per node
        self.next_step = 0
        phase = (n % 97) / 97 * cfg.sample_interval_s
        self.next_sample_at = t0 + phase if cfg.sample_interval_s else float("inf")
        self.plan_receiver = PlanReceiver()

    async def run(self) -> None:
        target = self.cfg.targets[self.n % len(self.cfg.targets)]
        while True:
            try:
                await self._session(target)
                return
            except (_Broken, grpc.aio.AioRpcError) as exc:
                self.stats.stream_errors.append(f"{self.node_id}: {exc!s:.200}")
                self.pending.clear()
                if self.clock() >= self.end or self.stop.is_set():
                    return
                self.stats.reconnects += 1
                await asyncio.sleep(0.5 + float(self.rng.random()))

    async def _session(self, target: str) -> None:
        out: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(self.cfg.max_in_flight)
        configured = asyncio.Event()

        async def requests():
            while True:
                msg = await out.get()
                if msg is None:
                    return
                yield msg

        self.plan_receiver = PlanReceiver()  # a delta builds on what THIS stream delivered
        call = rpc.IngestStub(self.channel_for(target)).Connect(requests())
        out.put_nowait(m.hello(self.cfg, self.n))
        reader = asyncio.create_task(self._read(call, out, window, configured))
        config_seen = asyncio.create_task(configured.wait())
        try:
            done, _ = await asyncio.wait([reader, config_seen], return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                reader.result()
                raise _Broken("stream ended before config")
            await self._send_schedule(out, window, reader)
            await self._drain(reader)
        finally:
            config_seen.cancel()
            out.put_nowait(None)
            if not reader.done():
                call.cancel()
                reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, call, out: asyncio.Queue, window: asyncio.Semaphore, configured: asyncio.Event):
        async for msg in call:
            kind = msg.WhichOneof("body")
            if kind == "ack":
                self._on_ack(msg.ack, window)
            elif kind == "config":
                self.seq = max(self.seq, msg.config.resume_after_seq)
                configured.set()
            elif kind == "plan":
                self._on_plan(msg.plan, out, configured)
        raise _Broken("stream ended by the server")

    def _on_plan(self, plan: pb.PlacementPlan, out: asyncio.Queue, configured: asyncio.Event) -> None:
        """Rebuild the full placement and report it applied (or the plan FAILED)."""
        try:
            self.plan_receiver.receive(plan)  # keeps the full placement as the next base
        except WireError as exc:
            error = f"node {self.node_id}: {exc}"
            if len(self.stats.error_messages) < 20:
                self.stats.error_messages.append(error)
            state = pb.PLAN_STATE_FAILED
        else:
            error, state = "", pb.PLAN_STATE_APPLIED
            self.stats.plans.append((self.node_id, plan.epoch, time.time(), plan.ByteSize(),
                                     bool(plan.base_epoch)))
        if (self.cfg.apply_plans or state == pb.PLAN_STATE_FAILED) and configured.is_set():
            report = pb.PlanReport(job_id=plan.job_id, epoch=plan.epoch, state=state,
                                   step=plan.not_before_step, error=error)
            self._enqueue(out, "plan_report", 0, plan_report=report)

    def _on_ack(self, ack: pb.Ack, window: asyncio.Semaphore) -> None:
        entry = self.pending.pop(ack.seq, None)
        if entry is None:
            return
        kind, sent, items, slot = entry
        if slot:
            window.release()
        if not self.pending:
            self.idle.set()
        if ack.code != 0:
            self.stats.errors[ack.code] += 1
            if len(self.stats.error_messages) < 20:
                self.stats.error_messages.append(f"{self.node_id} seq {ack.seq} {kind}: {ack.message}")
            return
        self.stats.ack_latency_s.append(time.perf_counter() - sent)
        self.stats.acked[kind] += 1
        self.acked.append(ack.seq)
        if ack.duplicate:
            self.stats.duplicates += 1
        elif kind == "loads":
            self.stats.counters_acked += items
        elif kind == "samples":
            self.stats.samples_acked += items

    def _enqueue(self, out: asyncio.Queue, kind: str, items: int, slot: bool = False, **body) -> None:
        """Queue one sequenced message; ``slot``: it holds a window slot until acked."""
        self.seq += 1
        self.idle.clear()
        self.pending[self.seq] = (kind, time.perf_counter(), items, slot)
        self.stats.sent[kind] += 1
        out.put_nowait(pb.AgentMessage(seq=self.seq, **body))

    async def _send(self, out, window, reader, kind: str, items: int, **body) -> None:
        acquire = asyncio.create_task(window.acquire())
        done, _ = await asyncio.wait([acquire, reader], return_when=asyncio.FIRST_COMPLETED)
        if reader in done:
            acquire.cancel()
            reader.result()
            raise _Broken("stream ended")
        self._enqueue(out, kind, items, slot=True, **body)

    async def _send_schedule(self, out, window, reader) -> None:
        cfg = self.cfg
        le = cfg.layers * cfg.experts
        while True:
            step_at = self.t0 + (self.next_step + 1) * cfg.step_time_s if cfg.step_time_s else float("inf")
            at = min(step_at, self.next_sample_at)
            if at > self.end:  # nothing more to send: stay connected (plans) until the end
                await self._pause(self.end, reader)
                return
            delay = at - self.clock()
            if delay > 0:
                await self._pause(at, reader)
            else:
                self.stats.max_lag_s = max(self.stats.max_lag_s, -delay)
            if self.stop.is_set():
                return
            if at == step_at:
                step = self.next_step
                self.next_step += 1
                for loads in m.loads(cfg, self.n, step, step_at, self.pool):
                    await self._send(out, window, reader, "loads", le, loads=loads)
                await self._send(out, window, reader, "step_stats", 0,
                                 step_stats=m.step_stats(cfg, self.n, step, step_at))
            else:
                self.next_sample_at += cfg.sample_interval_s
                frame = m.samples(cfg, self.n, at, self.rng)
                await self._send(out, window, reader, "samples", cfg.ranks_per_node * cfg.metrics,
                                 samples=frame)

    async def _pause(self, until: float, reader: asyncio.Task) -> None:
        """Wait until ``until`` (unix s) or a stop; raise _Broken if the stream ends first."""
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            done, _ = await asyncio.wait([reader, stopping], timeout=max(0.0, until - self.clock()),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if reader in done:
            reader.result()
            raise _Broken("stream ended")

    async def _drain(self, reader) -> None:
        """Wait (at most DRAIN_S) until every sent message is acknowledged.

        Checks again after each wake-up: between the last ack and this task resuming, the
        reader may take a plan and queue its report, which must be sent and acked too (the
        session closes the stream right after this returns, with no await in between).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_S
        while self.pending and not reader.done() and loop.time() < deadline:
            idle = asyncio.create_task(self.idle.wait())
            await asyncio.wait([idle, reader], timeout=deadline - loop.time(),
                               return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
