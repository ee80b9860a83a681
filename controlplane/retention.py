"""Retention and downsampling: roll raw data up into the 1-min and 1-h tiers, then delete what
is past its window. One pass is :meth:`Retention.run_once` (clock injected, so a test drives it
deterministically); :meth:`Retention.run` repeats it until a stop event.

Nothing raw is deleted before every tier has rolled it up (the cutoff never passes a watermark).
The ``received`` dedup claims older than the raw window are pruned too, keeping each node's
newest seq (its resume point).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store import tiers

log = logging.getLogger("moeplane.retention")


@dataclass(frozen=True)
class RetentionPolicy:
    """Windows in seconds; 0 keeps a tier forever. Raw windows must exceed the widest tier plus
    the lag, so every tier can be computed from raw."""

    raw_s: float = 2 * 86400.0  # device frames, step statistics
    loads_s: float = 14 * 86400.0  # per-step expert loads
    minute_s: float = 30 * 86400.0
    hour_s: float = 0.0
    lag_s: float = 120.0

    def __post_init__(self):
        need = max(tiers.TIERS) + self.lag_s
        for name in ("raw_s", "loads_s"):
            if getattr(self, name) < need:
                raise ValueError(f"{name}: must be at least {need:g} s (widest tier + lag)")
        for name in ("minute_s", "hour_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")
        if self.lag_s < 0:
            raise ValueError("lag_s: must be >= 0")

    def tier_window(self, tier: int) -> float:
        return {60: self.minute_s, 3600: self.hour_s}[tier]

    def raw_window(self, kind: str) -> float:
        return self.loads_s if kind == "loads" else self.raw_s


class Retention:
    def __init__(self, engine: Engine, policy: RetentionPolicy, clock: Callable[[], float] = time.time):
        self.engine = engine
        self.policy = policy
        self.clock = clock
        self.runs = 0
        self.last_run_at: float | None = None
        self.last_error: str = ""

    def run_once(self) -> dict[str, int]:
        """Roll up complete buckets, then delete expired rows. Returns counts by what was done."""
        now = self.clock()
        done: dict[str, int] = {}
        for kind in tiers.KINDS:
            for tier in tiers.TIERS:
                done[f"rollup_{kind}_{tier}"] = tiers.rollup(self.engine, kind, tier, now - self.policy.lag_s)
        marks = tiers.watermarks(self.engine)
        with self.engine.begin() as conn:
            for kind, table in tiers.RAW_TABLES.items():
                safe = min(marks.get((kind, tier), 0.0) for tier in tiers.TIERS)
                cut = min(now - self.policy.raw_window(kind), safe)
                if kind == "loads":
                    done["deleted_load_parts"] = self._drop_load_parts(conn, cut)
                done[f"deleted_{kind}"] = conn.execute(sa.delete(table).where(table.c.ts < cut)).rowcount
            done["deleted_received"] = self._drop_received(conn, now - self.policy.raw_s)
            for tier in tiers.TIERS:
                window = self.policy.tier_window(tier)
                if window <= 0:
                    continue
                cut = now - window
                n = 0
                for table in (t.sample_rollups, t.step_rollups, t.load_rollups):
                    n += conn.execute(
                        sa.delete(table).where(table.c.tier == tier, table.c.bucket + tier <= cut)
                    ).rowcount
                done[f"deleted_tier_{tier}"] = n
        self.runs += 1
        self.last_run_at = now
        return done

    @staticmethod
    def _drop_load_parts(conn, cut: float) -> int:
        """Dedup parts of steps whose loads are about to be deleted."""
        e = t.expert_loads.c
        last = conn.execute(sa.select(e.job_id, sa.func.max(e.step)).where(e.ts < cut).group_by(e.job_id)).all()
        n = 0
        for job_id, step in last:
            n += conn.execute(
                sa.delete(t.load_parts).where(t.load_parts.c.job_id == job_id, t.load_parts.c.step <= step)
            ).rowcount
        return n

    @staticmethod
    def _drop_received(conn, cut: float) -> int:
        r = t.received
        r2 = t.received.alias("r2")
        newest = sa.select(sa.func.max(r2.c.seq)).where(r2.c.node_id == r.c.node_id).scalar_subquery()
        return conn.execute(
            sa.delete(r).where(r.c.received_at > 0, r.c.received_at < cut, r.c.seq < newest)
        ).rowcount

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Run a pass every ``interval_s`` (the first one interval after start) until ``stop``;
        a failed pass is logged and retried at the next interval."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            if stop.is_set():
                return
            try:
                await asyncio.to_thread(self.run_once)
                self.last_error = ""
            except SQLAlchemyError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("retention pass failed: %s", self.last_error)
