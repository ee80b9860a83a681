"""The shared shape of a reconcile loop: every ``interval_s``, reconcile in a worker thread,
publish what it returns on ``<channel>.<job>``; a failing tick is logged and the loop goes on.
On stop, leadership of every job is given back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sqlalchemy.engine import Engine

from moeplane.controlplane.controller.leader import Leadership

log = logging.getLogger(__name__)


class ReconcileLoop:
    """Subclasses set ``channel`` and implement ``reconcile_all() -> [(job_id, payload)]``."""

    channel: str = ""

    def __init__(self, engine: Engine, bus, leadership: Leadership, *, interval_s: float = 0.5,
                 clock=time.time):
        self.engine = engine
        self.bus = bus
        self.leadership = leadership
        self.interval_s = interval_s
        self.clock = clock

    def reconcile_all(self) -> list[tuple[str, bytes]]:
        raise NotImplementedError

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    messages = await asyncio.to_thread(self.reconcile_all)
                    for job_id, payload in messages:
                        await self.bus.publish(f"{self.channel}.{job_id}", payload)
                except Exception:  # noqa: BLE001 - a bad tick must not stop the loop; logged
                    log.exception("%s tick failed", type(self).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            await asyncio.to_thread(self.leadership.release_all)
