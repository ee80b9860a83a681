"""One agent's ``Ingest.Connect`` stream: its hello, its sequenced messages, what it may write.

The stream knows its node (from the hello), the devices it declared and the ranks of its job it
announced; a message naming another node's rank gets PERMISSION_DENIED (``Denied``), a bad
field INVALID_ARGUMENT (``WireError``), and the stream goes on. It ends (``Abort``) on a first
message that is not a hello, bytes that are no AgentMessage, or when its token is revoked or
an operator releases its node (``ENDED_CHANNEL``, ``IngestService.end_streams``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from moeplane.controlplane.auth.streams import (
    ENDED_CHANNEL,
    IngestDenied,
    check_node,
    ended_payload,
)
from moeplane.controlplane.auth.tokens import Principal
from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.ingest import memory as m
from moeplane.controlplane.ingest import planpush
from moeplane.controlplane.ingest import validate as v
from moeplane.controlplane.ingest.steps import MAX_INT64
from moeplane.controlplane.store import memory_profiles, offload
from moeplane.controlplane.store.claims import Claimed, SpecConflict
from moeplane.controlplane.store.queries import NotFound
from moeplane.controlplane.store.records import MarkerRecord
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.framing import length_delimited, varint

if TYPE_CHECKING:
    from moeplane.controlplane.ingest.service import IngestService

OK, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, INTERNAL = 0, 3, 5, 7, 13


def ok_ack(seq: int, duplicate: bool) -> bytes:
    """Serialized ``ControlMessage(ack=Ack(seq=seq, duplicate=duplicate))`` (code OK), built
    without message objects: one per acknowledged message, so it is on the hot path.
    Field 2 (``ack``, length-delimited, tag 0x12) holding field 1 (``seq``, varint, tag 0x08)
    and, when set, field 4 (``duplicate``, varint, tag 0x20)."""
    body = (b"\x08" + varint(seq) if seq else b"") + (b"\x20\x01" if duplicate else b"")
    return length_delimited(0x12, body)


class Garbage:
    """A request that did not parse as an AgentMessage (``error``: why)."""

    def __init__(self, error: str):
        self.error = error


def parse_agent_message(data: bytes) -> pb.AgentMessage | Garbage:
    """The request deserializer: bytes that are no AgentMessage become a Garbage the stream
    refuses with INVALID_ARGUMENT (raised here, gRPC would end the call with UNKNOWN)."""
    try:
        return pb.AgentMessage.FromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, or others on odd input
        return Garbage(f"{type(exc).__name__}: {exc}"[:200])


class Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class Denied(Exception):
    """The node may not do this (PERMISSION_DENIED)."""


class Stream:
    """State of one agent stream."""

    def __init__(self, svc: IngestService, context, out: asyncio.Queue):
        self.svc = svc
        self.context = context
        self.out = out
        self.node_id: str | None = None
        self.job_id: str = ""
        self.devices: set[str] = set()  # only grows: a layout checked once stays valid
        self.ranks: frozenset[int] = frozenset()  # the ranks of its job the last hello announced
        self.ended: Abort | None = None  # set when its token was revoked or claims released
        self.checked_layouts = v.CheckedLayouts()
        self.in_flight = asyncio.Semaphore(svc.max_in_flight)
        self.follows: list[str] = []  # bus channels of the job this stream follows (besides plans)
        self.kept: list[str] = []  # bus channels it follows until it closes
        self.principal: Principal | None = None  # None: open mode
        self.plans = planpush.StreamPlans(svc.plans, out)

    def ack(self, seq: int, code: int = OK, message: str = "", duplicate: bool = False) -> None:
        if code == OK:
            self.out.put_nowait(ok_ack(seq, duplicate))
        else:
            self.out.put_nowait(pb.ControlMessage(ack=pb.Ack(seq=seq, code=code, message=message, duplicate=duplicate)))

    def stored(self, record, result: bool | BaseException) -> None:
        """The batcher's callback after ``record``'s transaction: free its window slot and ack
        (OK with the duplicate flag, or INTERNAL when it was not stored)."""
        self.in_flight.release()
        if isinstance(result, BaseException):
            self.ack(record.seq, INTERNAL, f"not stored: {type(result).__name__}")
        else:
            self.out.put_nowait(ok_ack(record.seq, result))

    async def follow_ended(self) -> None:
        """End this stream when its token is revoked or its node's claims are released (on any
        replica: the REST handler publishes on ENDED_CHANNEL)."""
        await self._follow(ENDED_CHANNEL, self.ended_by, keep=True)

    def ended_by(self, payload: bytes) -> Abort | None:
        """The stream's end (also kept in ``ended``) when ``payload`` names its token or node."""
        principal = self.principal
        if principal is not None and payload == ended_payload(token_id=principal.token_id):
            self.ended = Abort(grpc.StatusCode.UNAUTHENTICATED, "the stream's token was revoked")
        elif self.node_id is not None and payload == ended_payload(node_id=self.node_id):
            self.ended = Abort(grpc.StatusCode.ABORTED,
                                f"an operator released node {self.node_id!r}'s devices and ranks; say hello again")
        return self.ended

    async def read(self, request_iterator) -> None:
        async for msg in request_iterator:
            if self.ended is not None:  # nothing more is stored once its token is revoked
                raise self.ended
            if isinstance(msg, Garbage):
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an AgentMessage: {msg.error}")
            kind = msg.WhichOneof("body")
            if self.node_id is None and kind != "hello":
                raise Abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message must be hello")
            try:
                if kind == "hello":
                    await self.on_hello(msg)
                elif kind is None:
                    raise WireError("body", "empty message")
                else:
                    await self.on_sequenced(kind, msg)
            except WireError as exc:
                self.ack(msg.seq, INVALID_ARGUMENT, str(exc))
            except Denied as exc:
                self.ack(msg.seq, PERMISSION_DENIED, str(exc))

    async def on_hello(self, msg: pb.AgentMessage) -> None:
        try:
            hello = v.hello_record(msg.hello, self.svc.clock())
        except WireError as exc:
            if self.node_id is None:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            raise
        try:
            check_node(self.principal, hello.node_id)
        except IngestDenied as exc:
            raise Abort(exc.code, exc.details) from exc
        if self.node_id is not None and hello.node_id != self.node_id:
            raise WireError("hello.node_id", f"a stream serves one node ({self.node_id!r})")
        try:
            max_seq = await asyncio.to_thread(self.svc.writer.register_hello, hello)
        except SpecConflict as exc:  # the first hello's refusal ends the stream, a later one's is acked
            if self.node_id is None:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            raise WireError(exc.field, exc.message) from exc
        except Claimed as exc:
            if self.node_id is None:
                raise Abort(grpc.StatusCode.PERMISSION_DENIED, str(exc)) from exc
            raise Denied(str(exc)) from exc
        if self.node_id is None:
            self.svc.connected[hello.node_id] = self.svc.connected.get(hello.node_id, 0) + 1
        self.node_id = hello.node_id
        self.devices = {d.device_id for d in hello.devices} | self.devices
        self.ranks = frozenset(hello.ranks) if hello.job_id else frozenset()
        if hello.job_id:
            job = hello.job
            self.svc.catalog.learned(hello.job_id, job and job.layers, job and job.experts)
        job_changed, self.job_id = hello.job_id != self.job_id, hello.job_id
        # Config before following the job's channels: the agent must read Config first on a new
        # stream, and a plan published before the subscription is live is the running plan,
        # sent below once it is
        self.out.put_nowait(
            pb.ControlMessage(
                config=pb.Config(
                    sample_interval_s=self.svc.sample_interval_s,
                    job_id=self.job_id,
                    resume_after_seq=max_seq,
                )
            )
        )
        if job_changed:
            await self._follow_job()
        if self.job_id:
            await self.plans.send_running(self.svc.writer.engine, self.job_id)
            await self.send_pushed_offload()

    async def _follow_job(self) -> None:
        """(Re)subscribe to the job's plans and offload decisions on the bus."""
        await self._unfollow()
        await self.plans.follow(self.job_id)
        if not self.job_id:
            return
        await self._follow(f"offload.{self.job_id}", self._offload_control)

    async def _follow(self, channel: str, control: Callable[[bytes], object | None], keep: bool = False) -> None:
        """Forward each payload published on ``channel`` as ``control(payload)`` (None: skip).
        ``keep``: follow until the stream closes, not only until its job changes."""

        def deliver(payload: bytes) -> None:
            message = control(payload)
            if message is not None:
                self.out.put_nowait(message)

        (self.kept if keep else self.follows).append(channel)
        await self.svc.channels.follow(channel, self, deliver)

    async def _unfollow(self, kept: bool = False) -> None:
        for channels in (self.follows, self.kept) if kept else (self.follows,):
            for channel in channels:
                await self.svc.channels.unfollow(channel, self)
            channels.clear()

    def _offload_control(self, payload: bytes) -> pb.ControlMessage | None:
        decision = pb.OffloadDecision.FromString(payload)
        return pb.ControlMessage(offload=decision) if decision.device_id in self.devices else None

    async def on_sequenced(self, kind: str, msg: pb.AgentMessage) -> None:
        seq = msg.seq
        if seq <= 0 or seq > MAX_INT64:
            raise WireError("seq", f"must be a per-node sequence number in 1..{MAX_INT64}, got {seq}")
        if kind == "samples":
            rec = v.samples_record(msg.samples, node_id=self.node_id, seq=seq, known_devices=self.devices,
                                   checked_layouts=self.checked_layouts)
        elif kind == "loads":
            job = await self.svc.catalog.get(msg.loads.job_id) if msg.loads.job_id else None
            rec = v.loads_record(msg.loads, node_id=self.node_id, seq=seq, job=job)
            self.check_ranks("loads.ranks", rec.ranks)
            self.check_ranks("loads.missing_ranks", rec.missing_ranks)
            await self.check_step(rec.job_id, rec.step, "loads.step")
            if job.layers is None:  # the first loads of a job fix its [L, E]
                await asyncio.to_thread(
                    self.svc.writer.set_job_shape, rec.job_id, *rec.counts.shape
                )
                self.svc.catalog.forget(rec.job_id)
        elif kind == "step_stats":
            job = await self.svc.catalog.get(msg.step_stats.job_id) if msg.step_stats.job_id else None
            rec = v.step_stats_record(msg.step_stats, node_id=self.node_id, seq=seq, job_known=job is not None)
            self.check_ranks("step_stats.ranks", [r.rank for r in rec.ranks])
            await self.check_step(rec.job_id, rec.step, "step_stats.step")
        elif kind == "plan_report":
            await self.on_plan_report(msg)
            rec = MarkerRecord(self.node_id, seq)
        elif kind == "memory":
            await self.on_memory(msg)
            rec = MarkerRecord(self.node_id, seq)
        elif kind == "offload_report":
            await self.on_offload_report(msg)
            rec = MarkerRecord(self.node_id, seq)
        elif kind == "rl":  # stored idempotently by key, then the (node, seq) claim as above
            await self.svc.rl.accept(msg.rl, node_id=self.node_id, job_id=self.job_id)
            rec = MarkerRecord(self.node_id, seq)
        else:  # pragma: no cover - every oneof member is handled above
            raise WireError("body", f"unexpected {kind}")
        await self.in_flight.acquire()
        try:
            await self.svc.batcher.admit_then(rec, self.stored)
        except BaseException:
            self.in_flight.release()
            raise

    def check_ranks(self, field: str, ranks) -> None:
        """Denied unless this node's hello announced every rank of ``ranks`` (in its job)."""
        if not self.ranks.issuperset(ranks):
            foreign = sorted(set(ranks) - self.ranks)
            raise Denied(f"{field}: rank(s) {foreign} are not announced by node {self.node_id!r} "
                          f"(its hello announced {sorted(self.ranks)} of job {self.job_id!r})")

    def check_job(self, field: str, job_id: str) -> None:
        """Denied unless ``job_id`` is the job this node's hello joined."""
        if job_id != self.job_id:
            raise Denied(f"{field}: node {self.node_id!r} is not part of job {job_id!r}")

    async def check_step(self, job_id: str, step: int, field: str) -> None:
        self.check_job(field.split(".")[0] + ".job_id", job_id)
        if self.svc.steps is not None:
            await self.svc.steps.check(job_id, step, field)

    async def on_plan_report(self, msg: pb.AgentMessage) -> None:
        r = msg.plan_report
        self.check_job("plan_report.job_id", r.job_id)
        states = {pb.PLAN_STATE_RECEIVED: "received", pb.PLAN_STATE_APPLIED: "applied", pb.PLAN_STATE_FAILED: "failed"}
        if r.state not in states:
            raise WireError("plan_report.state", f"unknown state {r.state}")
        if r.epoch <= 0:
            raise WireError("plan_report.epoch", f"must be positive, got {r.epoch}")
        if r.state == pb.PLAN_STATE_FAILED:
            self.plans.forget()  # the agent may lack the plan a delta would build on
        try:
            # one transaction per batch of reports of this plan (1,024 agents report at once)
            await self.svc.plan_reports.record(
                r.job_id, r.epoch, self.node_id, states[r.state], r.step, r.error[:2000],
            )
        except NotFound as exc:
            raise WireError("plan_report.epoch", str(exc)) from exc
        except PermissionError as exc:
            raise Denied(str(exc)) from exc

    async def on_memory(self, msg: pb.AgentMessage) -> None:
        if msg.memory.job_id and msg.memory.job_id != self.job_id:
            raise Denied(f"node {self.node_id!r} is not part of job {msg.memory.job_id!r}")
        node, profiles = m.profile_records(
            msg.memory, node_id=self.node_id, job_id=self.job_id, known_devices=self.devices
        )
        self.check_ranks("memory.devices.rank", [p.rank for p in profiles])
        await asyncio.to_thread(memory_profiles.save_profiles, self.svc.writer.engine, node, profiles)

    async def on_offload_report(self, msg: pb.AgentMessage) -> None:
        fields = m.report_fields(msg.offload_report)
        try:
            await asyncio.to_thread(
                offload.record_report, self.svc.writer.engine, msg.offload_report.decision_id,
                node_id=self.node_id, clock=self.svc.clock, **fields,
            )
        except NotFound as exc:
            raise WireError("offload_report.decision_id", str(exc)) from exc
        except PermissionError as exc:
            raise Denied(str(exc)) from exc
        except ValueError as exc:
            raise WireError("offload_report", str(exc)) from exc

    async def send_pushed_offload(self) -> None:
        """A (re)connecting agent gets the offload decisions still waiting for its devices."""
        pushed = await asyncio.to_thread(
            offload.list_decisions, self.svc.writer.engine, self.job_id,
            status=Status.PUSHED, limit=1000,
        )
        for decision in reversed(pushed):
            if decision["device_id"] in self.devices:
                self.out.put_nowait(pb.ControlMessage(offload=m.decision_message(decision)))

    async def close(self) -> None:
        await self._unfollow(kept=True)
        await self.plans.follow("")
        if self.node_id is not None:
            n = self.svc.connected.get(self.node_id, 1) - 1
            if n <= 0:
                self.svc.connected.pop(self.node_id, None)
            else:
                self.svc.connected[self.node_id] = n
