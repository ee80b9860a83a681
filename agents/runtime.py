"""The node agent: sampling loop, step deadlines, local endpoint and uplink in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moeplane.agents import messages
from moeplane.agents import metrics as m
from moeplane.agents.collectors.base import Collector
from moeplane.agents.follow.tail import Follower
from moeplane.agents.local import default_socket_path, start_local_server
from moeplane.agents.node import NodeState
from moeplane.agents.spool import Spool
from moeplane.agents.uplink import Uplink, UplinkOptions
from moeplane.controlplane.wire import moeplane_pb2 as pb

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"


@dataclass
class AgentOptions:
    node_id: str
    spool_dir: str
    interval_s: float = 1.0
    job_id: str = ""
    ranks: list[int] = field(default_factory=list)
    local_socket: str = ""
    step_deadline_s: float = 10.0
    memory_interval_s: float = 10.0
    max_spool_messages: int = 200_000
    max_spool_bytes: int = 256 << 20
    uplink: UplinkOptions = field(default_factory=UplinkOptions)
    follow: list[tuple[str, str]] = field(default_factory=list)  # (verl|areal, path): RL logs
    rl_flush_s: float = 1.0  # the ranks' RL reports go up merged, once per this many seconds


def host_free_bytes() -> int:
    """Memory available to new processes on this host (psutil), bytes."""
    import psutil

    return int(psutil.virtual_memory().available)


class Agent:
    """One node agent. ``clock`` gives unix seconds (timestamps), ``monotonic`` schedules,
    ``host_free`` the host's free memory in bytes (for memory profiles)."""

    def __init__(self, options: AgentOptions, collector: Collector, *,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 host_free: Callable[[], int] = host_free_bytes):
        if options.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {options.interval_s}")
        self.options = options
        self.collector = collector
        self.clock = clock
        self.monotonic = monotonic
        self.host_free = host_free
        self.interval_s = options.interval_s
        self.spool = Spool(options.spool_dir, max_messages=options.max_spool_messages,
                           max_bytes=options.max_spool_bytes)
        self.node: NodeState | None = None
        self.uplink: Uplink | None = None
        self.followers: list[Follower] = []  # --follow sources, started by run()

    def _emit(self, msg: pb.AgentMessage) -> int:
        seq = self.spool.append(msg)
        self.uplink.wakeup.set()
        return seq

    def _on_control(self, msg: pb.ControlMessage) -> None:
        body = msg.WhichOneof("body")
        if body == "config":
            cfg = msg.config
            if cfg.sample_interval_s > 0 and cfg.sample_interval_s != self.interval_s:
                log.info("sample interval %.3g s (from the control plane)",
                         cfg.sample_interval_s)
                self.interval_s = cfg.sample_interval_s
            if cfg.job_id and not self.node.job_id:
                self.node.job_id = cfg.job_id
        elif body == "plan":
            self.node.on_plan(msg.plan)
        elif body == "offload":
            self.node.on_offload(msg.offload)

    def _on_plan_failed(self, plan: pb.PlacementPlan, error: str) -> None:
        """A plan the uplink could not rebuild (e.g. a delta against a base it lacks): report
        it FAILED; the ranks never see it, and the control plane sends the next plan in full."""
        self._emit(messages.plan_report(plan.job_id, plan.epoch, pb.PLAN_STATE_FAILED,
                                        error=f"node {self.options.node_id}: {error}"))

    def sample_once(self) -> int:
        """Take one sampling round and spool it; return its seq."""
        now = self.clock()
        follow = getattr(self.collector, "follow_host_bound", None)
        if follow is not None and self.node.host_bound:
            follow(self.node.host_bound)  # the sim collector mirrors the ranks it serves
        values = self.collector.sample(now)
        names = list(self.collector.metrics)
        ids = [d.device_id for d in self.collector.devices]
        rank_ids = self.node.rank_devices(set(ids))
        if rank_ids:  # rows of devices only ranks know: the collector measured none of them
            values = np.vstack([np.asarray(values, dtype=np.float64).reshape(len(ids), len(names)),
                                np.full((len(rank_ids), len(names)), math.nan)])
            ids = ids + rank_ids
        extra_names, extra = [], []
        hb = self.node.host_bound
        if hb:
            extra_names.append(m.HOST_BOUND_RATIO)
            extra.append([hb.get(i, math.nan) for i in ids])
        mem = self.node.rank_memory
        if any(i in mem for i in rank_ids):  # memory the rank-only devices' ranks measured
            first = len(ids) - len(rank_ids)  # their rows
            for col, name in ((0, m.MEMORY_USED_BYTES), (1, m.MEMORY_TOTAL_BYTES)):
                row = [float(mem[i][col]) if i in mem else math.nan for i in ids]
                if name in names:  # the collector's column: fill the rank devices' rows
                    values[first:, names.index(name)] = row[first:]
                else:
                    extra_names.append(name)
                    extra.append(row)
        dropped = self.spool.dropped_total
        if dropped:
            extra_names.append(m.SPOOL_DROPPED_TOTAL)
            extra.append([float(dropped)] * len(ids))
        if extra:
            values = np.column_stack([values, np.array(extra, dtype=np.float64).T])
        return self._emit(messages.samples(now, ids, names + extra_names, values))

    async def _sample_loop(self, stop: asyncio.Event) -> None:
        self.collector.sample(self.clock())  # prime rate counters; first round has no rates
        next_at = self.monotonic() + self.interval_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - self.monotonic()))
            if stop.is_set():
                break
            self.sample_once()
            now = self.monotonic()
            next_at += self.interval_s
            if next_at < now:  # overran: skip missed rounds rather than burst
                next_at = now + self.interval_s

    async def _deadline_loop(self, stop: asyncio.Event) -> None:
        node = self.node
        while not stop.is_set():
            deadline = node.aggregator.next_deadline() if node.aggregator else None
            timeout = None if deadline is None else max(0.0, deadline - self.monotonic())
            await _until_set_or_timeout(stop, node.step_opened, timeout)
            node.flush_due()

    async def _memory_loop(self, stop: asyncio.Event) -> None:
        """Send the ranks' memory profiles as they come, at most once per memory interval."""
        node = self.node
        while not stop.is_set():
            due = node.offload.due_at()
            timeout = None if due is None else max(0.0, due - self.monotonic())
            await _until_set_or_timeout(stop, node.memory_changed, timeout)
            node.flush_memory()

    async def _rl_loop(self, stop: asyncio.Event) -> None:
        """Send the ranks' RL reports, merged, once per ``rl_flush_s``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.options.rl_flush_s)
            self.node.rl.flush()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; on the way out, emit open steps and close the spool."""
        o = self.options
        devices = [messages.device_info(d) for d in self.collector.devices]
        self.node = NodeState(o.node_id, self._emit, devices=devices,
                              hostname=socket.gethostname(), version=AGENT_VERSION,
                              job_id=o.job_id, ranks=o.ranks,
                              step_deadline_s=o.step_deadline_s, monotonic=self.monotonic,
                              clock=self.clock, memory_interval_s=o.memory_interval_s,
                              host_free=self.host_free)
        self.uplink = Uplink(self.spool, o.uplink, self.node.hello, self._on_control,
                             self._on_plan_failed)
        local = await start_local_server(self.node, o.local_socket
                                         or default_socket_path(o.node_id))
        log.info("agent %s: %d devices, spool %s (%d pending, next seq %d)", o.node_id,
                 len(devices), self.spool.path, self.spool.count, self.spool.next_seq)
        tasks = [asyncio.create_task(self._sample_loop(stop)),
                 asyncio.create_task(self._deadline_loop(stop)),
                 asyncio.create_task(self._memory_loop(stop)),
                 asyncio.create_task(self.uplink.run(stop))]
        tasks.append(asyncio.create_task(self._rl_loop(stop)))
        self.followers = [Follower(kind, Path(path), self._emit, job_id=lambda: self.node.job_id,
                                   clock=self.clock) for kind, path in o.follow]
        tasks += [asyncio.create_task(f.run(stop)) for f in self.followers]
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            await local.stop(grace=0.5)
            self.node.flush_due(math.inf)
            self.node.flush_memory(force=True)
            self.node.rl.flush()
            self.spool.close()
            self.collector.close()
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r


async def _until_set_or_timeout(stop: asyncio.Event, event: asyncio.Event, timeout: float | None) -> None:
    """Clear ``event``, then wait until it or ``stop`` is set, or ``timeout`` seconds pass."""
    event.clear()
    waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(event.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
