"""Placement plans down the ingest streams.

A plan committed by the leader is published on the bus channel ``plans.<job>`` as a serialized
PlacementPlan; every replica's ingest forwards it to the job's agent streams. The serialized
ControlMessage is built once per published plan and shared by every stream (a 1,024-rank plan
is ~475 KB); ``add_ingest_to_server`` lets such bytes pass through gRPC untouched. A
(re)connecting agent gets the plan its job should run.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.engine import Engine

from controlplane.controller.runner import plan_message
from controlplane.store import plans

log = logging.getLogger(__name__)


def control_with_plan(plan: bytes) -> bytes:
    """Serialized ``ControlMessage(plan=PlacementPlan)`` from the plan's serialized bytes:
    field 3, wire type 2 (tag 0x1a), varint length, the bytes."""
    n, length = len(plan), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    return b"\x1a" + bytes(length) + plan


class PlanCache:
    """One per ingest service: the shared ControlMessage bytes of the last published plan."""

    def __init__(self) -> None:
        self._plan_cache: tuple[bytes, bytes] | None = None

    def plan_control(self, payload: bytes) -> bytes:
        """The serialized ControlMessage of a published plan, built once and shared by every
        stream. ``payload`` is a serialized PlacementPlan; the ControlMessage is its bytes
        behind the tag of field 3 (``plan``, length-delimited), so nothing is parsed or
        re-serialized per stream."""
        cached = self._plan_cache
        if cached is None or (cached[0] is not payload and cached[0] != payload):
            cached = (payload, control_with_plan(payload))
            self._plan_cache = cached
        return cached[1]


class StreamPlans:
    """The plan side of one agent stream: what to put on the stream's queue ``out``."""

    def __init__(self, cache: PlanCache, out: asyncio.Queue):
        self.cache = cache
        self.out = out

    def control(self, payload: bytes) -> bytes | None:
        """The ControlMessage bytes to send for a plan published on the bus (None: nothing)."""
        return self.cache.plan_control(payload)

    async def send_running(self, engine: Engine, job_id: str) -> None:
        """A (re)connecting agent gets the placement its job should run."""
        plan = await asyncio.to_thread(
            plans.latest_plan, engine, job_id, (plans.PlanStatus.PUSHED, plans.PlanStatus.APPLIED),
        )
        if plan is not None:
            self.out.put_nowait(control_with_plan(plan_message(plan, 0)))
