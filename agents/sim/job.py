"""A simulated MoE training job: N nodes x G ranks in one process, reporting through agents.

Every rank reports ``RankStep`` (its ``counts[L, E]``, step statistics and ``MemoryProfile``)
on its own ``NodeLocal`` stream to the agent of its node, exactly as the SDK does. The job
runs a placement ``phy2log[L, W*S]``: its step time follows the load of the busiest rank under
that placement (see :func:`moeplane.agents.sim.workload.step_time_s`). A placement plan
received from the agents is applied on every rank at the same step, once every rank has it,
and reported APPLIED (or FAILED with the reason, keeping the running placement).

Two kinds of trouble come and go on a schedule (:class:`moeplane.agents.sim.workload.Spells`):

- memory pressure: in a longer-sequence phase a few ranks (on different nodes) run
  ``pressure_seq_factor`` times longer sequences, so their activations grow past the high
  watermark (:mod:`moeplane.agents.sim.memory`). An offload decision pushed to a rank takes
  effect at its next step and is reported APPLIED with the peak it measured; its actions'
  predicted step-time overhead is added to the step;
- host-bound spells: the data loader of one node (the next one each spell) is slow; its ranks
  wait on the host for ``host_bound_ratio`` of each step, and the whole job waits with them
  (a longer step; for the other ranks that wait is not host time). Outside the spells every
  rank waits on the host for well under 2 % of a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import grpc
import numpy as np

from moeplane.agents.sim.memory import MemorySpec, RankMemory
from moeplane.agents.sim.ranklink import RankLink
from moeplane.agents.sim.workload import (
    ExpertLoadModel,
    Spells,
    WorkloadSpec,
    balancedness,
    identity_phy2log,
    spread_ranks,
    step_time_s,
)
from moeplane.controlplane.balancing.routing import route_replicas, routed_gpu_loads
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array, encode_array

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    job_id: str
    nodes: int
    gpus_per_node: int
    layers: int
    experts: int
    top_k: int
    groups: int = 0               # K expert groups, each kept on one node (0: none)
    tokens_per_step: int = 4096   # tokens each rank routes per step
    step_time_s: float = 1.0      # step time of a perfectly balanced placement
    steps: int = 0                # 0: run until stopped
    seed: int = 0
    socket_template: str = "/tmp/moeplane-agent-{node}.sock"
    node_template: str = "node-{i}"
    attach_timeout_s: float = 60.0
    memory: MemorySpec | None = field(default_factory=MemorySpec)  # None: no memory profiles
    pressure: Spells = Spells(every=90, length=30, first=15)  # longer-sequence phases
    pressure_ranks: int = 3
    pressure_seq_factor: float = 1.7
    host_spells: Spells = Spells(every=120, length=30, first=30)  # a slow data loader
    host_bound_ratio: float = 0.4  # of the slow node's ranks, during a spell

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_id(self, i: int) -> str:
        return self.node_template.format(i=i)

    def device_id(self, rank: int) -> str:
        node, local = divmod(rank, self.gpus_per_node)
        return f"{self.node_id(node)}/gpu{local}"


def check_plan(plan: pb.PlacementPlan, layers: int, experts: int, world: int) -> np.ndarray:
    """phy2log [L, W*S] int64 of a full plan this job can run (``plan.phy2log`` in any integer
    dtype: uint8 on the wire for E <= 256); raises ValueError naming the field."""
    s = plan.slots_per_rank
    if s < 1:
        raise WireError("plan.slots_per_rank", f"must be >= 1, got {s}")
    if plan.base_epoch:
        raise WireError("plan.base_epoch", f"a delta (base_epoch {plan.base_epoch}); ranks take full plans")
    phy2log = decode_array(plan.phy2log, "plan.phy2log", ndim=2, shape=(layers, world * s),
                           kinds="iu")
    if phy2log.size and (phy2log.min() < 0 or phy2log.max() >= experts):
        raise WireError("plan.phy2log", f"expert ids outside [0, {experts})")
    for layer in range(layers):
        if np.unique(phy2log[layer]).size != experts:
            raise WireError("plan.phy2log", f"layer {layer} leaves a logical expert unplaced")
    return phy2log.astype(np.int64)


class SimulatedJob:
    """Runs ``options.steps`` steps (forever with 0) until ``stop`` is set."""

    def __init__(self, options: JobOptions, *, clock: Callable[[], float] = time.time):
        o = options
        self.o = o
        self.clock = clock
        W = o.world_size
        self.model = ExpertLoadModel(
            WorkloadSpec(o.layers, o.experts, o.top_k, W, tokens_per_rank=o.tokens_per_step),
            seed=o.seed)
        self.phy2log, self.slots = identity_phy2log(o.layers, o.experts, W)
        self.epoch = 0
        self.rng = np.random.default_rng(o.seed + 1)
        self.host_base = self.rng.beta(2, 300, W)  # waits on the host outside spells: ~0.7 %
        self.memory = [] if o.memory is None else [
            RankMemory(o.memory, layers=o.layers, slots=self.slots, top_k=o.top_k,
                       rng=np.random.default_rng([o.seed, 2, r])) for r in range(W)]
        if self.memory and not self.memory[0].fits():
            log.warning("no memory profiles: %d layers of width %d need %.0f GiB per rank, more "
                        "than the %.0f GiB device (try a smaller --hidden, --seq-len or "
                        "--micro-batch)", o.layers, o.memory.hidden,
                        self.memory[0].demand() / 2**30, o.memory.capacity_bytes / 2**30)
            self.memory = []
        self.pending: dict[int, pb.PlacementPlan] = {}
        self.received: dict[int, set[int]] = {}
        self.step = 0
        self.history: list[tuple[int, float, float]] = []  # (step, balancedness, step time)
        self.links: list[RankLink] = []

    def job_spec(self) -> pb.JobSpec:
        o = self.o
        return pb.JobSpec(job_id=o.job_id, layers=o.layers, experts=o.experts, top_k=o.top_k,
                          world_size=o.world_size, slots_per_rank=self.slots,
                          ranks_per_node=o.gpus_per_node, groups=o.groups)

    def _on_offload(self, rank: int, decision: pb.OffloadDecision) -> None:
        if decision.job_id == self.o.job_id and self.memory:
            self.memory[rank].submit(decision)

    def _on_plan(self, rank: int, plan: pb.PlacementPlan) -> None:
        if plan.job_id != self.o.job_id or plan.epoch <= self.epoch:
            return
        self.pending.setdefault(plan.epoch, plan)
        self.received.setdefault(plan.epoch, set()).add(rank)

    def _maybe_switch(self) -> None:
        """Switch every rank to the newest plan all ranks hold, at this step."""
        W = self.o.world_size
        ready = [e for e, ranks in self.received.items() if len(ranks) == W]
        if not ready:
            return
        epoch = max(ready)
        plan = self.pending[epoch]
        if self.step < plan.not_before_step:
            return
        for e in [e for e in self.pending if e <= epoch]:
            self.pending.pop(e)
            self.received.pop(e, None)
        try:
            phy2log = check_plan(plan, self.o.layers, self.o.experts, W)
        except ValueError as exc:
            log.warning("plan epoch %d rejected: %s", epoch, exc)
            self._report(epoch, pb.PLAN_STATE_FAILED, self.step, str(exc))
            return
        self.phy2log, self.slots, self.epoch = phy2log, plan.slots_per_rank, epoch
        for m in self.memory:  # a rank holds as many experts as it has slots
            m.shape = replace(m.shape, experts_per_device=self.slots)
        log.info("step %d: applied plan epoch %d", self.step, epoch)
        self._report(epoch, pb.PLAN_STATE_APPLIED, self.step)

    def _report(self, epoch: int, state: int, step: int, error: str = "") -> None:
        for link in self.links:
            link.send(pb.RankMessage(plan_report=pb.PlanReport(
                job_id=self.o.job_id, epoch=epoch, state=state, step=step, error=error)))

    def _memory_step(self, step: int) -> tuple[list[pb.MemoryProfile], dict[int, pb.OffloadReport], float]:
        """Every rank's memory this step: profiles, reports of decisions taken at this step,
        and the largest predicted overhead of the actions in effect (seconds)."""
        o = self.o
        spell = o.pressure.index(step)
        pressed = set() if spell is None else set(spread_ranks(
            o.seed, spell, o.pressure_ranks, o.nodes, o.gpus_per_node))
        profiles, reports, overhead = [], {}, 0.0
        for r, mem in enumerate(self.memory):
            measured, report = mem.step(o.pressure_seq_factor if r in pressed else 1.0)
            profiles.append(mem.profile(measured, o.device_id(r), r))
            overhead = max(overhead, measured.plan.overhead())
            if report is not None:
                report.step = step
                reports[r] = report
                log.info("step %d: rank %d %s offload decision %d (%s): peak %.1f GiB",
                         step, r, pb.PlanState.Name(report.state), report.decision_id,
                         ", ".join(profiles[-1].applied_actions) or "no actions",
                         measured.used_bytes / 2**30)
        return profiles, reports, overhead

    def _host_bound(self, t: float, step: int) -> tuple[np.ndarray, float]:
        """Each rank's host-bound ratio and the step time with a slow data loader's wait."""
        o = self.o
        host = np.clip(self.host_base + self.rng.normal(0, 0.002, o.world_size), 0, 1)
        spell = o.host_spells.index(step)
        if spell is None:
            return host, t
        slow = slice((spell % o.nodes) * o.gpus_per_node, (spell % o.nodes + 1) * o.gpus_per_node)
        share = float(np.clip(o.host_bound_ratio + self.rng.normal(0, 0.02), 0, 0.95))
        wait = t * share / (1 - share)  # the slow node's ranks wait this long for their data
        host *= t / (t + wait)  # everyone else's own waits are a smaller share of a longer step
        host[slow] = np.clip(share + host[slow] * t / (t + wait), 0, 1)
        return host, t + wait

    def run_step(self) -> tuple[float, Callable[[], None]]:
        """Simulate one step on every rank; returns its step time and ``report()``, which
        queues every rank's report (call it when the step has ended)."""
        o = self.o
        self._maybe_switch()
        step = self.step
        counts = self.model.step()                      # [W, L, E]
        # [L, W] tokens per rank, each expert's tokens routed among its replicas as the SDK does
        per_gpu = routed_gpu_loads(
            route_replicas(counts.sum(axis=0), self.phy2log, gpus=o.world_size), o.world_size)
        balance = balancedness(per_gpu)
        t = step_time_s(o.step_time_s, balance) * float(self.rng.uniform(0.98, 1.02))
        profiles, offload_reports, overhead = self._memory_step(step)
        host, t = self._host_bound(t + overhead, step)

        def report() -> None:
            now = self.clock()
            for link in self.links:
                r = link.rank
                msg = pb.RankStep(step=step, counts=encode_array(counts[r]), timestamp=now,
                                  stats=pb.RankStepStats(rank=r, step_time_s=t,
                                                         host_bound_ratio=float(host[r]),
                                                         tokens=o.tokens_per_step))
                if profiles:
                    msg.memory.CopyFrom(profiles[r])
                link.send(pb.RankMessage(step=msg))
                if r in offload_reports:
                    link.send(pb.RankMessage(offload_report=offload_reports[r]))

        self.history.append((step, balance, t))
        self.step += 1
        return t, report

    async def run(self, stop: asyncio.Event) -> None:
        o = self.o
        channels = [grpc.aio.insecure_channel(
            "unix:" + o.socket_template.format(node=o.node_id(n), i=n)) for n in range(o.nodes)]
        spec = self.job_spec()
        for r in range(o.world_size):
            hello = pb.RankHello(job=spec, rank=r, device_id=o.device_id(r))
            self.links.append(RankLink(channels[r // o.gpus_per_node], hello, self._on_plan,
                                       on_offload=self._on_offload, seed=o.seed + r))
        for link in self.links:
            link.start()
        try:
            attached = asyncio.ensure_future(
                asyncio.gather(*(x.attached.wait() for x in self.links)))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([attached, stopped], timeout=o.attach_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if stop.is_set():
                attached.cancel()
                return
            if not attached.done():
                attached.cancel()
                missing = [x.rank for x in self.links if not x.attached.is_set()]
                raise TimeoutError(f"ranks {missing} could not attach to their agents in "
                                   f"{o.attach_timeout_s} s (is `moeplane agent` running with "
                                   f"--local-socket {o.socket_template}?)")
            log.info("job %s: %d ranks attached to %d agents", o.job_id, o.world_size, o.nodes)
            while not stop.is_set() and (o.steps == 0 or self.step < o.steps):
                t, report = self.run_step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), t)
                if stop.is_set():
                    break  # the step did not finish
                report()
                if self.step % 10 == 0:
                    _, balance, _ = self.history[-1]
                    log.info("step %d: balancedness %.3f, step time %.3f s, epoch %d",
                             self.step - 1, balance, t, self.epoch)
            await asyncio.gather(*(x.drain(10) for x in self.links))
        finally:
            for link in self.links:
                await link.close()
            for ch in channels:
                await ch.close()
