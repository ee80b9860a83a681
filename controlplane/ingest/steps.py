"""The far-ahead bound on steps: a node's loads or step statistics for a step more than
``max_ahead`` steps past the job's newest step are refused (INVALID_ARGUMENT).

A node that announced the job cannot move its ``latest_step`` to 10**12 and bury every honest
step under it. The newest step is read from the store once per job and then kept here, raised
by every step this replica admits; a step past the bound of the kept value is checked again
against the store before it is refused (another replica may have stored newer steps).
A job without any stored step takes its first step as it comes (a job may start, or resume
from a checkpoint, at any step). Steps are ints in 0..2**63-1 (the store's BIGINT).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from moeplane.controlplane.wire.arrays import WireError

MAX_INT64 = 2**63 - 1
DEFAULT_MAX_AHEAD = 1_000_000


class StepBound:
    """``newest(job_id)``: the job's newest stored step or None (blocking; run in a thread).
    ``max_ahead``: how many steps past the newest one a step may be (>= 1)."""

    def __init__(self, newest: Callable[[str], int | None], max_ahead: int = DEFAULT_MAX_AHEAD):
        if max_ahead < 1:
            raise ValueError(f"max_steps_ahead: must be >= 1, got {max_ahead}")
        self._newest = newest
        self.max_ahead = max_ahead
        self._latest: dict[str, int | None] = {}

    async def check(self, job_id: str, step: int, field: str) -> None:
        """Admit ``step`` of ``job_id`` (and remember it) or raise WireError naming ``field``."""
        if step < 0 or step > MAX_INT64:
            raise WireError(field, f"must be in 0..{MAX_INT64}, got {step}")
        if job_id not in self._latest:
            self._latest[job_id] = await asyncio.to_thread(self._newest, job_id)
        latest = self._latest[job_id]
        if latest is not None and step - latest > self.max_ahead:
            latest = await asyncio.to_thread(self._newest, job_id)
            if latest is not None and step - latest > self.max_ahead:
                raise WireError(field, f"step {step} is more than {self.max_ahead} steps ahead of job "
                                       f"{job_id!r}'s newest step {latest}")
        self._latest[job_id] = step if latest is None else max(latest, step)

    def forget(self, job_id: str) -> None:
        self._latest.pop(job_id, None)
