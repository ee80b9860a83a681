"""The agent's stream to the control plane (``Ingest.Connect``), reconnecting forever.

Per connection: a fresh Hello (its own seq), wait for Config, then send every spooled message
in seq order (a window of at most ``window`` unacknowledged) while reading acks, plans and
config. Plans may come as deltas against the plan this connection delivered last; each is
rebuilt into the full placement (a per-connection ``PlanReceiver``) before ``on_control`` sees
it, and one that cannot be rebuilt goes to ``on_plan_failed`` instead. An ack with a final code (``FINAL_CODES``: stored, or rejected for good) removes the
message from the spool; a rejection is logged and the message is never resent. Any other code
(e.g. INTERNAL: the store failed) keeps the message and resends it after ``retry_after_s``.
After a lost connection, every unacknowledged message is resent: the control plane
deduplicates. Reconnects wait a jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from moeplane.agents.backoff import Backoff
from moeplane.agents.spool import Spool
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.plan_codec import PlanReceiver, full_plan

log = logging.getLogger(__name__)

METHOD = "/moeplane.v1.Ingest/Connect"
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
FINAL_CODES = frozenset((0, 3, 5, 7))  # stored, or rejected for good; anything else: retry


class SessionLost(Exception):
    """The control plane closed the stream or broke the protocol."""


@dataclass
class UplinkOptions:
    server: str = "127.0.0.1:50051"
    token: str = ""
    tls: bool = False
    tls_ca_file: str = ""
    window: int = 512
    config_timeout_s: float = 10.0
    max_message_bytes: int = 32 << 20
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 10.0
    retry_after_s: float = 1.0
    seed: int | None = None


class Uplink:
    """Owns the connection. ``hello()`` builds the opening Hello; ``on_control`` takes config,
    offload decisions and plans (always full: deltas are rebuilt here); ``on_plan_failed(plan,
    error)`` takes a plan that could not be rebuilt (e.g. a delta whose base this connection
    did not deliver); ``wakeup`` is set whenever the spool gained a message."""

    def __init__(self, spool: Spool, options: UplinkOptions, hello: Callable[[], pb.Hello],
                 on_control: Callable[[pb.ControlMessage], None],
                 on_plan_failed: Callable[[pb.PlacementPlan, str], None] | None = None):
        self.spool = spool
        self.options = options
        self.hello = hello
        self.on_control = on_control
        self.on_plan_failed = on_plan_failed
        self.plans = PlanReceiver()
        self.wakeup = asyncio.Event()
        self.connected = asyncio.Event()
        self.sessions = 0
        self.rejected = 0
        self._inflight: set[int] = set()
        self._retry: set[int] = set()

    def _channel(self) -> grpc.aio.Channel:
        o = self.options
        opts = [("grpc.max_send_message_length", o.max_message_bytes),
                ("grpc.max_receive_message_length", o.max_message_bytes)]
        if o.tls:
            ca = open(o.tls_ca_file, "rb").read() if o.tls_ca_file else None  # noqa: SIM115
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
            return grpc.aio.secure_channel(o.server, creds, options=opts)
        return grpc.aio.insecure_channel(o.server, options=opts)

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, stream, reconnect with backoff until ``stop`` is set."""
        backoff = Backoff(self.options.backoff_base_s, self.options.backoff_cap_s,
                          self.options.seed)
        while not stop.is_set():
            try:
                await self._session(stop, backoff)
            except (grpc.aio.AioRpcError, SessionLost,
                    asyncio.InvalidStateError, grpc.aio.UsageError, OSError) as exc:
                log.warning("connection to %s lost: %s", self.options.server, _describe(exc))
            finally:
                self.connected.clear()
            if stop.is_set():
                break
            delay = backoff.next_delay()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _session(self, stop: asyncio.Event, backoff: Backoff) -> None:
        metadata = (("authorization", f"Bearer {self.options.token}"),) \
            if self.options.token else None
        self.plans = PlanReceiver()  # a delta builds on what THIS stream delivered
        async with self._channel() as channel:
            connect = channel.stream_stream(
                METHOD, request_serializer=bytes,
                response_deserializer=pb.ControlMessage.FromString)
            call = connect(metadata=metadata)
            try:
                hello = pb.AgentMessage(seq=self.spool.allocate_seq(), hello=self.hello())
                await call.write(hello.SerializeToString())
                first = await asyncio.wait_for(call.read(), self.options.config_timeout_s)
                if first is grpc.aio.EOF:
                    raise SessionLost("stream closed before Config")
                if first.WhichOneof("body") != "config":
                    raise SessionLost(f"expected Config first, got {first.WhichOneof('body')}")
                self._on_config(first.config, hello.seq)
                backoff.reset()
                self.sessions += 1
                self.connected.set()
                log.info("connected to %s (session %d)", self.options.server, self.sessions)
                tasks = [asyncio.create_task(self._send(call)),
                         asyncio.create_task(self._receive(call)),
                         asyncio.create_task(stop.wait())]
                try:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                for t in done:
                    if not t.cancelled() and t.exception() is not None:
                        raise t.exception()
            finally:
                call.cancel()

    def _on_config(self, config: pb.Config, hello_seq: int) -> None:
        if config.resume_after_seq > hello_seq:
            # The control plane stored seqs this spool never issued: the spool was lost.
            self.spool.advance_past(config.resume_after_seq)
        self.on_control(pb.ControlMessage(config=config))

    async def _send(self, call) -> None:
        self._inflight.clear()
        self._retry.clear()  # a new session resends everything pending anyway
        last_sent = 0
        while True:
            self.wakeup.clear()
            for seq in sorted(self._retry):
                self._retry.discard(seq)
                payload = self.spool.get(seq)
                if payload is not None:
                    await call.write(payload)
                    self._inflight.add(seq)
            room = self.options.window - len(self._inflight)
            batch = self.spool.pending(after_seq=last_sent, limit=room) if room > 0 else []
            for seq, payload in batch:
                await call.write(payload)
                self._inflight.add(seq)
                last_sent = seq
            if not batch:
                await self.wakeup.wait()

    async def _receive(self, call) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise SessionLost("stream closed by the control plane")
            body = msg.WhichOneof("body")
            if body == "ack":
                self._on_ack(msg.ack)
            elif body == "plan":
                self._on_plan(msg.plan)
            else:
                self.on_control(msg)

    def _on_plan(self, plan: pb.PlacementPlan) -> None:
        """Rebuild ``plan`` (full or delta) into a full plan for ``on_control``."""
        try:
            phy2log = self.plans.receive(plan)
        except WireError as exc:
            log.warning("plan epoch %d of job %s not usable: %s", plan.epoch, plan.job_id, exc)
            if self.on_plan_failed is not None:
                self.on_plan_failed(plan, str(exc))
            return
        if plan.base_epoch:
            plan = full_plan(plan.job_id, plan.epoch, phy2log, plan.slots_per_rank,
                             plan.not_before_step)
        self.on_control(pb.ControlMessage(plan=plan))

    def _on_ack(self, ack: pb.Ack) -> None:
        self._inflight.discard(ack.seq)
        if ack.code not in FINAL_CODES:
            log.warning("message seq %d not stored (%s): %s; retrying in %.3g s", ack.seq,
                        CODE_NAMES.get(ack.code, ack.code), ack.message,
                        self.options.retry_after_s)
            asyncio.get_running_loop().call_later(self.options.retry_after_s, self._retry_seq,
                                                  ack.seq)
            self.wakeup.set()
            return
        self.spool.ack([ack.seq])
        if ack.code != 0:
            self.rejected += 1
            log.warning("message seq %d rejected (%s): %s", ack.seq,
                        CODE_NAMES.get(ack.code, ack.code), ack.message)
        self.wakeup.set()

    def _retry_seq(self, seq: int) -> None:
        self._retry.add(seq)
        self.wakeup.set()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
