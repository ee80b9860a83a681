"""The one executor of decisions: approve → push → publish, for placement plans and memory-offload
decisions alike. The controller (auto policy), REST and the dashboard's buttons all call it.

The store steps (``approve_plan``, ``push_plan``, ...) are synchronous and return the message
to publish; :class:`Executor` runs them off the event loop and publishes on the bus channel
``plans.<job>`` or ``offload.<job>``, where every replica's ingest streams it to the job's
agents. A step the decision's state does not allow raises Conflict (REST: 409).
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy.engine import Engine

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.memory.codec import decision_message
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.wire.plan_codec import plan_message


def push_plan(engine: Engine, job_id: str, epoch: int, clock=time.time) -> bytes:
    """approved → pushed; returns the PlacementPlan to publish on ``plans.<job>``, to switch
    at the step after the job's newest."""
    plan = P.transition(engine, job_id, epoch, Status.PUSHED, clock=clock)
    return plan_message(plan, (q.latest_step(engine, job_id) or 0) + 1)


def approve_plan(engine: Engine, job_id: str, epoch: int, detail: str, clock=time.time) -> bytes:
    """proposed → approved → pushed; returns the message to publish."""
    P.transition(engine, job_id, epoch, Status.APPROVED, detail=detail, clock=clock)
    return push_plan(engine, job_id, epoch, clock)


def reject_plan(engine: Engine, job_id: str, epoch: int, detail: str = "rejected by operator",
                clock=time.time) -> dict:
    """open → rejected (nothing to publish); returns the plan."""
    return P.transition(engine, job_id, epoch, Status.REJECTED, detail=detail, clock=clock)


def push_decision(engine: Engine, job_id: str, decision_id: int, clock=time.time) -> bytes:
    """approved → pushed; returns the OffloadDecision to publish on ``offload.<job>``."""
    decision = O.transition(engine, job_id, decision_id, Status.PUSHED, clock=clock)
    return decision_message(decision).SerializeToString()


def approve_decision(engine: Engine, job_id: str, decision_id: int, detail: str,
                     clock=time.time) -> bytes:
    """proposed → approved → pushed; returns the message to publish."""
    O.transition(engine, job_id, decision_id, Status.APPROVED, detail=detail, clock=clock)
    return push_decision(engine, job_id, decision_id, clock)


class Executor:
    """The store steps above, run off the event loop, then published on ``bus``."""

    def __init__(self, engine: Engine, bus, clock=time.time):
        self.engine = engine
        self.bus = bus
        self.clock = clock

    async def _run(self, channel: str, job_id: str, step, *args) -> None:
        payload = await asyncio.to_thread(step, self.engine, job_id, *args, clock=self.clock)
        await self.bus.publish(f"{channel}.{job_id}", payload)

    async def approve_plan(self, job_id: str, epoch: int, detail: str = "approved by operator") -> dict:
        await self._run("plans", job_id, approve_plan, epoch, detail)
        return await asyncio.to_thread(P.get_plan, self.engine, job_id, epoch, with_placement=False)

    async def push_plan(self, job_id: str, epoch: int) -> dict:
        await self._run("plans", job_id, push_plan, epoch)
        return await asyncio.to_thread(P.get_plan, self.engine, job_id, epoch, with_placement=False)

    async def reject_plan(self, job_id: str, epoch: int, detail: str = "rejected by operator") -> dict:
        return await asyncio.to_thread(reject_plan, self.engine, job_id, epoch, detail, self.clock)

    async def approve_decision(self, job_id: str, decision_id: int,
                               detail: str = "approved by operator") -> dict:
        await self._run("offload", job_id, approve_decision, decision_id, detail)
        return await asyncio.to_thread(O.get_decision, self.engine, job_id, decision_id)

    async def reject_decision(self, job_id: str, decision_id: int,
                              detail: str = "rejected by operator") -> dict:
        return await asyncio.to_thread(O.transition, self.engine, job_id, decision_id,
                                       Status.REJECTED, detail=detail, clock=self.clock)
