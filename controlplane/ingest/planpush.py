"""Placement plans down the ingest streams, full or as a delta.

A plan committed by the leader is published on the bus channel ``plans.<job>`` as a serialized
full PlacementPlan (phy2log in its narrowest integer dtype); every replica's ingest forwards it
to the job's agent streams. Per published plan, the :class:`PlanCache` builds two serialized
ControlMessages once and shares them by every stream: the full plan, and a delta (only the
changed slots) against the plan of this job that the replica saw before it. Each stream
(:class:`StreamPlans`) remembers which plan it delivered last — gRPC streams are ordered, so the
agent holds exactly that one — and gets the delta when that is the delta's base, else the full
plan: a new stream, a reconnect, the running plan sent at connect, a stream that missed the base,
or a stream whose agent reported a plan FAILED. ``add_ingest_to_server`` lets the shared bytes
pass through gRPC untouched. See ``moeplane.controlplane.wire.plan_codec`` for the wire contract.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine

from moeplane.controlplane.ingest.following import SharedChannels
from moeplane.controlplane.store import plans
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.framing import length_delimited
from moeplane.controlplane.wire.plan_codec import decode_full, delta_plan, plan_message

log = logging.getLogger(__name__)


def control_with_plan(plan: bytes) -> bytes:
    """Serialized ``ControlMessage(plan=PlacementPlan)`` from the plan's serialized bytes:
    field 3, length-delimited (tag 0x1a)."""
    return length_delimited(0x1A, plan)


@dataclass(frozen=True)
class Published:
    """One plan of a job as this replica sends it: shared serialized ControlMessages."""

    payload: bytes  # the serialized full PlacementPlan (as published on the bus)
    epoch: int
    phy2log: np.ndarray  # [L, G*S] placement (any integer dtype), the base of the next delta
    full: bytes  # ControlMessage(plan=full)
    delta: bytes | None = None  # ControlMessage(plan=delta against base_epoch), when smaller
    base_epoch: int = 0


class _Loading:
    """A job's running-plan read: the lock its loaders queue on, and how many hold or wait on it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class PlanCache:
    """One per ingest service: per job, the last plan this replica published to its streams;
    the streams of a job share one subscription to ``plans.<job>`` (:class:`SharedChannels`)."""

    def __init__(self, channels: SharedChannels) -> None:
        self.channels = channels
        self._jobs: dict[str, Published] = {}
        self._bad: bytes | None = None  # the last payload that was not a plan (logged once)
        # job -> its lock, held while its running plan is read; only while someone holds or waits on it
        self._loading: dict[str, _Loading] = {}
        self.sent: Counter[str] = Counter()  # plans put on streams: "full" | "delta"

    async def follow(self, job_id: str, stream: StreamPlans) -> None:
        """Hand ``stream`` every plan of ``job_id`` published from now on (returns once the
        bus subscription is live, so the caller may read the running plan after it)."""
        await self.channels.follow(f"plans.{job_id}", stream,
                                   lambda payload: self._deliver(job_id, stream, payload))

    async def unfollow(self, job_id: str, stream: StreamPlans) -> None:
        """Stop handing plans of ``job_id`` to ``stream``."""
        await self.channels.unfollow(f"plans.{job_id}", stream)

    def _deliver(self, job_id: str, stream: StreamPlans, payload: bytes) -> None:
        try:
            pub = self.published(job_id, payload)  # built once: every stream gets the same bytes
        except Exception as exc:  # not a plan (WireError, DecodeError): the next may be
            if payload is not self._bad:
                self._bad = payload
                log.error("plan published on plans.%s dropped: %s", job_id, exc)
            return
        message = stream.message_for(job_id, pub)
        if message is not None:
            stream.out.put_nowait(message)

    def published(self, job_id: str, payload: bytes) -> Published:
        """The shared messages of a plan published on the bus (a serialized full
        PlacementPlan), built once for every stream of the job; the delta is against the last
        plan of ``job_id`` this cache holds, and a newer plan becomes that base."""
        last = self._jobs.get(job_id)
        if last is not None and (last.payload is payload or last.payload == payload):
            return last
        plan = pb.PlacementPlan.FromString(payload)
        phy2log = decode_full(plan)
        full = control_with_plan(payload)
        delta, base_epoch = None, 0
        if last is not None and last.epoch < plan.epoch:
            d = delta_plan(plan, phy2log, last.epoch, last.phy2log)
            if d is not None:
                d_bytes = control_with_plan(d.SerializeToString())
                if len(d_bytes) < len(full):
                    delta, base_epoch = d_bytes, last.epoch
        pub = Published(payload, plan.epoch, phy2log, full, delta, base_epoch)
        if last is None or last.epoch < plan.epoch:
            self._jobs[job_id] = pub
        return pub

    def cached(self, job_id: str, epoch: int) -> Published | None:
        """The shared messages of plan ``epoch`` of ``job_id`` when this replica holds them."""
        last = self._jobs.get(job_id)
        return last if last is not None and last.epoch == epoch else None

    async def load(self, engine: Engine, job_id: str, epoch: int) -> Published:
        """The shared messages of stored plan ``epoch`` (full only), read from the store only
        when this replica does not hold them; streams connecting at once wait for one read."""
        loading = self._loading.get(job_id)
        if loading is None:
            loading = self._loading[job_id] = _Loading()
        loading.users += 1  # counted before the first await: the entry cannot go while we wait
        try:
            async with loading.lock:
                pub = self.cached(job_id, epoch)
                if pub is None:
                    plan = await asyncio.to_thread(plans.get_plan, engine, job_id, epoch)
                    pub = self.running(job_id, plan)
        finally:  # also when cancelled or the read failed: the last one out drops the job's entry
            loading.users -= 1
            if loading.users == 0:
                del self._loading[job_id]
        return pub

    def running(self, job_id: str, plan: dict) -> Published:
        """The shared messages of a stored plan sent at connect (full only). A replica that has
        published nothing newer for the job keeps it as the base of its next delta."""
        return self.cached(job_id, plan["epoch"]) or self.published(job_id, plan_message(plan, 0))


class StreamPlans:
    """The plan side of one agent stream: what to put on the stream's queue ``out``."""

    def __init__(self, cache: PlanCache, out: asyncio.Queue):
        self.cache = cache
        self.out = out
        self.following = ""  # the job whose plans this stream gets
        self.job_id = ""
        self.epoch = 0  # epoch of the last plan delivered on this stream (0: none)

    async def follow(self, job_id: str) -> None:
        """Get the plans of ``job_id`` from now on ("": none); a stream follows one job."""
        if self.following:
            await self.cache.unfollow(self.following, self)
            self.following = ""
        if job_id:
            await self.cache.follow(job_id, self)
            self.following = job_id

    def message_for(self, job_id: str, pub: Published) -> bytes | None:
        """The bytes to send for ``pub`` (None: the stream already has it or a newer plan)."""
        same_job = job_id == self.job_id
        if same_job and pub.epoch <= self.epoch:
            return None
        delta = pub.delta is not None and same_job and self.epoch == pub.base_epoch
        self.cache.sent["delta" if delta else "full"] += 1
        self.job_id, self.epoch = job_id, pub.epoch
        return pub.delta if delta else pub.full

    def forget(self) -> None:
        """The agent may not hold the last plan (it reported one FAILED): the next is full."""
        self.job_id, self.epoch = "", 0

    async def send_running(self, engine: Engine, job_id: str) -> None:
        """A (re)connecting agent gets the placement its job should run, in full. The
        placement is read from the store only when this replica does not hold that plan's
        messages already: 1,024 agents reconnecting after a restart read it once, not 1,024
        times (3.8 MB each at 58x8192)."""
        plan = await asyncio.to_thread(
            plans.latest_plan, engine, job_id, (plans.Status.PUSHED, plans.Status.APPLIED),
            with_placement=False,
        )
        if plan is None:
            return
        message = self.message_for(job_id, await self.cache.load(engine, job_id, plan["epoch"]))
        if message is not None:
            self.out.put_nowait(message)
