"""What the agent knows about its node: attached ranks, the job, step aggregation, plans and
memory offload (:mod:`moeplane.agents.offload`).

Driven by the local endpoint (ranks) and the uplink (plans, offload decisions, config);
everything it wants to send upward goes through ``emit`` (the spool). Time comes in through
``monotonic``/``clock``.

A rank's device that the node's collector does not report (e.g. a CPU rank of a host-only
node) is announced in the node's hello as a device of kind ``rank``, so that the control plane
accepts that device's memory profiles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from moeplane.agents import messages
from moeplane.agents.aggregation import NodeStep, RankReport, StepAggregator
from moeplane.agents.offload import OffloadRelay
from moeplane.agents.rlrelay import RLRelay
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array

log = logging.getLogger(__name__)


@dataclass
class RankLink:
    """One attached training rank. ``outbox`` feeds its NodeLocal stream."""

    rank: int
    job: pb.JobSpec
    device_id: str
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)


@dataclass
class _PlanProgress:
    applied: dict[int, int] = field(default_factory=dict)  # rank -> step
    done: bool = False


class NodeState:
    """The node's ranks and job. ``emit(msg)`` numbers and spools an AgentMessage."""

    def __init__(self, node_id: str, emit: Callable[[pb.AgentMessage], int], *,
                 devices: list[pb.DeviceInfo], hostname: str, version: str, job_id: str = "",
                 ranks: list[int] | None = None, step_deadline_s: float = 10.0,
                 monotonic: Callable[[], float], clock: Callable[[], float] = time.time,
                 memory_interval_s: float = 10.0, host_free: Callable[[], int] = lambda: 0):
        self.node_id = node_id
        self.emit = emit
        self.devices = devices
        self.hostname = hostname
        self.version = version
        self.job_id = job_id
        self.configured_ranks = set(ranks or ())
        self.step_deadline_s = step_deadline_s
        self.monotonic = monotonic
        self.job: pb.JobSpec | None = None
        self.links: dict[int, RankLink] = {}
        self.device_ranks: dict[str, int] = {}
        self.host_bound: dict[str, float] = {}
        self.rank_memory: dict[str, tuple[int, int]] = {}  # device_id -> (used, capacity) bytes
        self.aggregator: StepAggregator | None = None
        self.plans: dict[int, _PlanProgress] = {}
        self.latest_plan: pb.PlacementPlan | None = None
        self.announced: tuple | None = None
        self.step_opened = asyncio.Event()
        self.offload = OffloadRelay(emit, interval_s=memory_interval_s, host_free=host_free,
                                    clock=clock)
        self.rl = RLRelay(emit)
        self.memory_changed = asyncio.Event()

    # ------------------------------------------------------------------ hello

    def hello(self) -> pb.Hello:
        """The Hello describing this node now; remembers what it announced."""
        for d in self.devices:
            d.rank = self.device_ranks.get(d.device_id, -1)
        self.announced = self._announcement()
        return pb.Hello(
            node_id=self.node_id, hostname=self.hostname, agent_version=self.version,
            devices=self.devices,
            job_id=self.job_id, ranks=sorted(self.ranks()), job=self.job or pb.JobSpec(),
        )

    def _announcement(self) -> tuple[str, bytes, tuple[tuple[str, int], ...], tuple[int, ...]]:
        """What a Hello says that can change mid-stream: job id, job spec, each device
        with the rank on it (a rank attaching to a device the agent already knew changes only
        the latter, and the control plane maps offload decisions and loads through it), and
        the ranks (the control plane stores the loads and statistics of announced ranks only)."""
        job = self.job.SerializeToString(deterministic=True) if self.job else b""
        return self.job_id, job, tuple((d.device_id, self.device_ranks.get(d.device_id, -1))
                                       for d in self.devices), tuple(sorted(self.ranks()))

    def ranks(self) -> set[int]:
        return self.configured_ranks | set(self.links)

    # ------------------------------------------------------------------ ranks

    def attach(self, hello: pb.RankHello) -> RankLink:
        """Register a rank. Raises ValueError naming the field when it does not fit."""
        job = hello.job
        if not job.job_id:
            raise ValueError("hello.job.job_id: empty")
        if self.job_id and job.job_id != self.job_id:
            raise ValueError(f"hello.job.job_id: {job.job_id!r} but this agent serves "
                             f"{self.job_id!r}")
        if job.layers < 1 or job.experts < 1:
            raise ValueError("hello.job: layers and experts must be >= 1")
        if self.job is not None and (job.layers, job.experts) != (self.job.layers,
                                                                 self.job.experts):
            raise ValueError(f"hello.job: shape {job.layers}x{job.experts} differs from "
                             f"{self.job.layers}x{self.job.experts} of attached ranks")
        if hello.rank < 0:
            raise ValueError(f"hello.rank: {hello.rank} < 0")
        if hello.rank in self.links:
            raise ValueError(f"hello.rank: rank {hello.rank} is already attached")
        self.job_id = job.job_id
        if self.job is None:
            self.job = pb.JobSpec()
            self.job.CopyFrom(job)
            self.aggregator = StepAggregator(job.job_id, self.configured_ranks,
                                             self.step_deadline_s)
        link = RankLink(hello.rank, job, hello.device_id)
        self.links[hello.rank] = link
        self.aggregator.expect(hello.rank)
        if hello.device_id:
            self.device_ranks[hello.device_id] = hello.rank
            if all(d.device_id != hello.device_id for d in self.devices):
                self.devices.append(pb.DeviceInfo(
                    device_id=hello.device_id, index=len(self.devices), kind="rank",
                    model=f"device of rank {hello.rank}", rank=hello.rank))
        self._announce_if_changed()
        if self.latest_plan is not None and self.latest_plan.job_id == self.job_id:
            link.outbox.put_nowait(pb.RankControl(plan=self.latest_plan))
        decision = self.offload.for_device(hello.device_id) if hello.device_id else None
        if decision is not None and decision.job_id == self.job_id:
            link.outbox.put_nowait(pb.RankControl(offload=decision))
        log.info("rank %d of job %s attached (device %s)", hello.rank, job.job_id,
                 hello.device_id or "-")
        return link

    def rank_devices(self, sampled: set[str]) -> list[str]:
        """Devices that only a rank's hello made known (kind "rank"): no collector samples
        them, so the node reports what their ranks measure (host-bound ratio, memory)."""
        return [d.device_id for d in self.devices
                if d.kind == "rank" and d.device_id not in sampled]

    def detach(self, link: RankLink) -> None:
        if self.links.get(link.rank) is link:
            del self.links[link.rank]
            log.info("rank %d detached", link.rank)

    def _announce_if_changed(self) -> None:
        """Send a fresh Hello mid-stream when the job or the devices changed since the last."""
        if self.announced is not None and self.announced != self._announcement():
            self.emit(pb.AgentMessage(hello=self.hello()))

    def rank_step(self, link: RankLink, step: pb.RankStep) -> None:
        """Validate and aggregate one rank's step. Raises ValueError naming the field.

        A bad ``step.memory`` raises after the step's counts were aggregated: the profile is
        dropped, the rest of the step counts.
        """
        if step.step < 0:
            raise ValueError(f"step.step: {step.step} < 0")
        counts = decode_array(step.counts, "step.counts", shape=(link.job.layers,
                              link.job.experts), ndim=2, kinds="i", nonnegative=True)
        s = step.stats
        if not 0.0 <= s.host_bound_ratio <= 1.0:
            raise WireError("step.stats.host_bound_ratio", f"{s.host_bound_ratio} not in [0, 1]")
        if not np.isfinite(s.step_time_s) or s.step_time_s < 0:
            raise WireError("step.stats.step_time_s", f"{s.step_time_s} is not >= 0")
        if s.tokens < 0:
            raise WireError("step.stats.tokens", f"{s.tokens} is negative")
        if not np.isfinite(step.timestamp) or step.timestamp < 0:
            raise WireError("step.timestamp", f"{step.timestamp} is not a unix time >= 0")
        if link.device_id:
            self.host_bound[link.device_id] = s.host_bound_ratio
        report = RankReport(link.rank, counts.astype(np.int64), s.step_time_s,
                            s.host_bound_ratio, s.tokens, step.timestamp)
        opened = step.step not in self.aggregator.open
        for done in self.aggregator.add(step.step, report, self.monotonic()):
            self._emit_step(done)
        if opened:
            self.step_opened.set()
        if step.HasField("memory"):
            self.offload.add_profile(link.rank, link.device_id, step.step, step.memory)
            self.rank_memory[link.device_id] = (step.memory.used_bytes,
                                                step.memory.capacity_bytes)
            self.memory_changed.set()

    def flush_memory(self, now: float | None = None, force: bool = False) -> int | None:
        """Emit the ranks' pending memory profiles when due (see :class:`OffloadRelay`)."""
        return self.offload.flush(self.job_id, self.monotonic() if now is None else now, force)

    def flush_due(self, now: float | None = None) -> None:
        """Emit steps whose deadline passed (all open steps with ``now=inf``)."""
        if self.aggregator is None:
            return
        for done in self.aggregator.due(self.monotonic() if now is None else now):
            self._emit_step(done)

    def _emit_step(self, done: NodeStep) -> None:
        if done.missing_ranks:
            log.warning("step %d of job %s: ranks %s missed the deadline", done.step,
                        done.job_id, list(done.missing_ranks))
        self.emit(messages.loads(done))
        self.emit(messages.step_stats(done))

    # ------------------------------------------------------------------ plans

    def on_plan(self, plan: pb.PlacementPlan) -> None:
        """Fan a plan from the control plane out to the job's attached ranks."""
        if self.latest_plan is not None and plan.job_id == self.latest_plan.job_id \
                and plan.epoch <= self.latest_plan.epoch:
            log.info("plan epoch %d of job %s already received", plan.epoch, plan.job_id)
            return
        self.latest_plan = plan
        self.plans.setdefault(plan.epoch, _PlanProgress())
        for link in self.links.values():
            if link.job.job_id == plan.job_id:
                link.outbox.put_nowait(pb.RankControl(plan=plan))
        self.emit(messages.plan_report(plan.job_id, plan.epoch, pb.PLAN_STATE_RECEIVED))

    # ------------------------------------------------------------------ offload

    def on_offload(self, decision: pb.OffloadDecision) -> None:
        """Forward a decision to the rank of its device (or its rank), once per decision_id."""
        if not self.offload.on_decision(decision):
            log.info("offload decision %d already received", decision.decision_id)
            return
        link = next((x for x in self.links.values() if x.device_id == decision.device_id),
                    None) or self.links.get(decision.rank)
        if link is None or link.job.job_id != decision.job_id:
            log.info("offload decision %d for %s: no such rank attached yet; kept for it",
                     decision.decision_id, decision.device_id)
            return
        link.outbox.put_nowait(pb.RankControl(offload=decision))

    def rank_rl(self, link: RankLink, report: pb.RLReport) -> None:
        """Queue a rank's RL report for the node's next merged one (the control plane validates
        its rows). Raises ValueError naming the field when it is another job's or malformed."""
        if report.job_id and report.job_id != link.job.job_id:
            raise ValueError(f"rl.job_id: {report.job_id!r} but rank {link.rank} serves "
                             f"{link.job.job_id!r}")
        report.job_id = link.job.job_id
        self.rl.add(report)  # merged with the other ranks' and sent by the agent's RL flush

    def rank_offload_report(self, link: RankLink, report: pb.OffloadReport) -> None:
        """Send a rank's offload report upward. Raises ValueError naming the field."""
        self.offload.report(link.rank, link.device_id, self.job_id, report)

    def rank_plan_report(self, link: RankLink, report: pb.PlanReport) -> None:
        """Forward APPLIED once every attached rank of the job applied (a rank that never
        attached cannot hold the node back); FAILED at the first failure."""
        progress = self.plans.setdefault(report.epoch, _PlanProgress())
        if progress.done:
            return
        if report.state == pb.PLAN_STATE_FAILED:
            progress.done = True
            self.emit(messages.plan_report(report.job_id, report.epoch, pb.PLAN_STATE_FAILED,
                                           report.step, f"rank {link.rank}: {report.error}"))
        elif report.state == pb.PLAN_STATE_APPLIED:
            progress.applied[link.rank] = report.step
            attached = {r for r, x in self.links.items() if x.job.job_id == report.job_id}
            if attached <= progress.applied.keys():
                progress.done = True
                self.emit(messages.plan_report(report.job_id, report.epoch,
                                               pb.PLAN_STATE_APPLIED,
                                               max(progress.applied.values())))
