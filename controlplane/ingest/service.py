"""``Ingest.Connect``: one bidirectional stream per node agent.

Up: hello first, then sequenced messages; each is validated, handed to the batcher, and
acknowledged after its transaction commits (duplicates are acknowledged too, flagged). A bad
message gets an Ack with INVALID_ARGUMENT naming the field; the stream goes on. Down: Config
after hello, Acks, placement plans published on the bus channel ``plans.<job>``, and offload
decisions published on ``offload.<job>`` for devices of the stream's node.
Backpressure: at most ``max_in_flight`` unacknowledged messages per stream, and at most the
batcher's ``max_pending_bytes`` of arrays awaiting commit over all streams; past either the
stream stops reading, and gRPC flow control slows the agent. Each stream's own state and
checks are in ``stream.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from moeplane.controlplane.auth.streams import IngestDenied, authenticate_stream
from moeplane.controlplane.auth.tokens import TokenStore
from moeplane.controlplane.ingest import planpush, planreports
from moeplane.controlplane.ingest import validate as v
from moeplane.controlplane.ingest.batcher import Batcher
from moeplane.controlplane.ingest.following import SharedChannels
from moeplane.controlplane.ingest.rl import RLIngest
from moeplane.controlplane.ingest.steps import StepBound
from moeplane.controlplane.ingest.stream import Abort, Stream, ok_ack, parse_agent_message
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc

__all__ = ["IngestService", "JobCatalog", "add_ingest_to_server", "ok_ack"]  # ok_ack: its old home

log = logging.getLogger(__name__)


class JobCatalog:
    """Shapes of known jobs, read through from the store (another replica may have added one)."""

    def __init__(self, load: Callable[[str], v.JobShape | None]):
        self._load = load
        self._jobs: dict[str, v.JobShape] = {}

    async def get(self, job_id: str) -> v.JobShape | None:
        shape = self._jobs.get(job_id)
        if shape is None or shape.layers is None:
            shape = await asyncio.to_thread(self._load, job_id)
            if shape is not None:
                self._jobs[job_id] = shape
        return shape

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def learned(self, job_id: str, layers: int | None, experts: int | None) -> None:
        """A hello just stored this job: keep its [L, E] if it declared both (what the store now
        holds), else read it through again on next use."""
        if layers and experts:
            self._jobs[job_id] = v.JobShape(layers, experts)
        else:
            self.forget(job_id)


class IngestService(rpc.IngestServicer):
    def __init__(
        self,
        writer: StoreWriter,
        batcher: Batcher,
        catalog: JobCatalog,
        bus,
        *,
        sample_interval_s: float = 1.0,
        max_in_flight: int = 1024,
        clock: Callable[[], float] = time.time,
        tokens: TokenStore | None = None,
        steps: StepBound | None = None,
    ):
        """``tokens``: check each stream's node token (None: open, loopback demo only).
        ``steps``: the far-ahead bound on loads and step statistics (None: no bound)."""
        self.writer = writer
        self.batcher = batcher
        self.catalog = catalog
        self.bus = bus
        self.sample_interval_s = sample_interval_s
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.tokens = tokens
        self.steps = steps
        self.connected: dict[str, int] = {}  # node_id -> open streams
        self.streams: set[Stream] = set()  # open streams of this replica
        self.channels = SharedChannels(bus)  # one bus subscription per job channel, not per stream
        self.plans = planpush.PlanCache(self.channels)  # shared plan bytes
        self.plan_reports = planreports.PlanReports(writer.engine, clock)  # one transaction per batch
        self.rl = RLIngest(writer.engine, catalog)  # RL phase spans, weight syncs, batches, phase loads

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        principal = None
        if self.tokens is not None:
            try:
                principal = await asyncio.to_thread(
                    authenticate_stream, self.tokens, context.invocation_metadata()
                )
            except IngestDenied as exc:
                await context.abort(exc.code, exc.details)
        out: asyncio.Queue = asyncio.Queue()
        stream = Stream(self, context, out)
        stream.principal = principal
        self.streams.add(stream)
        reader = asyncio.create_task(stream.read(request_iterator))
        reader.add_done_callback(lambda _t: out.put_nowait(None))
        try:
            await stream.follow_ended()
            while True:
                item = await out.get()
                if item is None:
                    break
                if isinstance(item, Abort):  # its token was revoked or its claims released
                    await context.abort(item.code, item.details)
                yield item
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                exc = reader.exception()
                if isinstance(exc, Abort):
                    await context.abort(exc.code, exc.details)
                raise exc
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.streams.discard(stream)
            await stream.close()


    def end_streams(self, payload: bytes) -> int:
        """End this replica's streams of a revoked token or a released node now (``payload``:
        ``ended_payload(...)``), before the bus brings the same payload. Returns how many."""
        ended = 0
        for stream in list(self.streams):
            abort = stream.ended_by(payload)
            if abort is not None:
                stream.out.put_nowait(abort)
                ended += 1
        return ended


def _serialize_control(msg: pb.ControlMessage | bytes) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


def add_ingest_to_server(service: IngestService, server) -> None:
    """Register ``Ingest.Connect`` like the generated ``add_IngestServicer_to_server``, except
    that responses already serialized (shared plan bytes) pass through untouched."""
    handler = grpc.stream_stream_rpc_method_handler(
        service.Connect,
        request_deserializer=parse_agent_message,
        response_serializer=_serialize_control,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("moeplane.v1.Ingest", {"Connect": handler}),)
    )


