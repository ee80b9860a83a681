"""A tiny but real control plane for agent tests: grpc.aio ``Ingest.Connect`` on a TCP port.

It runs its own event loop in a thread, stores what agents send (deduplicated exactly like the
real control plane: samples by (node, seq), loads by (job, node, step), step stats by
(job, step, rank)), acknowledges after "commit", and can hold acks, reject messages, drop every
connection, push plans and be stopped and restarted on the same port.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc


@dataclass
class Store:
    stored: dict[tuple[str, int], pb.AgentMessage] = field(default_factory=dict)
    loads: dict[tuple[str, str, int], pb.ExpertLoads] = field(default_factory=dict)
    step_stats: dict[tuple[str, int, int], pb.RankStepStats] = field(default_factory=dict)
    received: list[tuple[str, pb.AgentMessage]] = field(default_factory=list)
    duplicates: int = 0
    hellos: list[pb.Hello] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    connects: int = 0


class FakeIngest(pb_grpc.IngestServicer):
    def __init__(self, port: int, sample_interval_s: float = 0.0,
                 tls: tuple[bytes, bytes] | None = None):
        self.port = port
        self.tls = tls  # (private key PEM, certificate PEM)
        self.sample_interval_s = sample_interval_s
        self.store = Store()
        self.cond = threading.Condition()
        self.hold_acks = False
        # reject(msg) -> None (store it), "reason" (INVALID_ARGUMENT) or (code, "reason")
        self.reject: Callable[[pb.AgentMessage], object] = lambda msg: None
        self.resume_after_seq: int | None = None  # override of the computed value
        self._streams: list[asyncio.Queue] = []
        self._contexts: list = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: grpc.aio.Server | None = None
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeIngest:
        ready = threading.Event()

        def main() -> None:
            self.loop = asyncio.new_event_loop()
            self.loop.run_until_complete(self._start())
            ready.set()
            self.loop.run_forever()
            self.loop.close()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake ingest did not start")
        return self

    async def _start(self) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_IngestServicer_to_server(self, self.server)
        address = f"127.0.0.1:{self.port}"
        if self.tls:
            creds = grpc.ssl_server_credentials([self.tls])
            bound = self.server.add_secure_port(address, creds)
        else:
            bound = self.server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"port {self.port} busy")
        await self.server.start()

    def stop(self) -> None:
        """Stop serving (connections drop); the store is kept for a later :meth:`start`."""
        if self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(grace=None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop = None
        self._streams.clear()
        self._contexts.clear()

    def drop_connections(self) -> None:
        """Abort every open stream, as a crashed or restarted replica would."""
        for q in list(self._streams):
            self.loop.call_soon_threadsafe(q.put_nowait, None)

    def send_plan(self, plan: pb.PlacementPlan) -> None:
        self.send_control(pb.ControlMessage(plan=plan))

    def send_control(self, msg: pb.ControlMessage) -> None:
        """Write ``msg`` (a plan, an offload decision, ...) down every open stream."""
        for q in list(self._streams):
            self.loop.call_soon_threadsafe(q.put_nowait, msg)

    # ------------------------------------------------------------------ waiting

    def wait_for(self, predicate: Callable[[Store], object], timeout: float = 20.0):
        """Block until ``predicate(store)`` is truthy; return its value or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate(self.store)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"condition not met in {timeout} s")
                self.cond.wait(left)

    def snapshot(self, fn: Callable[[Store], object]):
        with self.cond:
            return fn(self.store)

    # ------------------------------------------------------------------ the RPC

    def _commit(self, node: str, msg: pb.AgentMessage) -> pb.Ack:
        body = msg.WhichOneof("body")
        with self.cond:
            self.store.received.append((node, msg))
            try:
                reason = self.reject(msg)
                if reason:
                    code, text = reason if isinstance(reason, tuple) else (3, reason)
                    return pb.Ack(seq=msg.seq, code=code, message=text)
                if body == "hello":
                    self.store.hellos.append(msg.hello)
                key = (node, msg.seq)
                if key in self.store.stored:
                    self.store.duplicates += 1
                    return pb.Ack(seq=msg.seq, code=0, duplicate=True)
                self.store.stored[key] = msg
                if body == "loads":
                    lk = (msg.loads.job_id, node, msg.loads.step)
                    self.store.loads.setdefault(lk, msg.loads)
                elif body == "step_stats":
                    for r in msg.step_stats.ranks:
                        sk = (msg.step_stats.job_id, msg.step_stats.step, r.rank)
                        self.store.step_stats.setdefault(sk, r)
                return pb.Ack(seq=msg.seq, code=0)
            finally:
                self.cond.notify_all()

    async def Connect(self, request_iterator, context):  # noqa: N802
        md = {k: v for k, v in context.invocation_metadata()}
        first = await context.read()
        if first is grpc.aio.EOF or first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello first")
        node = first.hello.node_id
        with self.cond:
            self.store.connects += 1
            self.store.metadata.append(md)
            seqs = [s for (n, s) in self.store.stored if n == node]
            self.cond.notify_all()
        resume = self.resume_after_seq if self.resume_after_seq is not None else max(seqs,
                                                                                     default=0)
        await context.write(pb.ControlMessage(config=pb.Config(
            sample_interval_s=self.sample_interval_s, resume_after_seq=resume)))
        self._commit(node, first)  # like the real control plane: a hello is not acknowledged
        out: asyncio.Queue = asyncio.Queue()
        self._streams.append(out)

        async def reader() -> None:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    out.put_nowait(None)
                    return
                ack = self._commit(node, msg)
                if msg.WhichOneof("body") != "hello" and not self.hold_acks:
                    out.put_nowait(pb.ControlMessage(ack=ack))

        task = asyncio.create_task(reader())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                await context.write(item)
        finally:
            task.cancel()
            self._streams.remove(out)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "stream ended by the fake control plane")
