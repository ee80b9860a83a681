"""A simulated MoE training job: N nodes x G ranks in one process, reporting through agents.

Every rank reports ``RankStep`` (its ``counts[L, E]`` and step statistics) on its own
``NodeLocal`` stream to the agent of its node, exactly as the SDK does. The job runs a
placement ``phy2log[L, W*S]``: its step time follows the load of the busiest rank under that
placement (see :func:`moeplane.agents.sim.workload.step_time_s`). A placement plan received from the
agents is applied on every rank at the same step, once every rank has it, and reported APPLIED
(or FAILED with the reason, keeping the running placement).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np

from moeplane.agents.sim.ranklink import RankLink
from moeplane.agents.sim.workload import (
    ExpertLoadModel,
    WorkloadSpec,
    balancedness,
    identity_phy2log,
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
    tokens_per_step: int = 4096   # tokens each rank routes per step
    step_time_s: float = 1.0      # step time of a perfectly balanced placement
    steps: int = 0                # 0: run until stopped
    seed: int = 0
    socket_template: str = "/tmp/moeplane-agent-{node}.sock"
    node_template: str = "node-{i}"
    attach_timeout_s: float = 60.0

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_id(self, i: int) -> str:
        return self.node_template.format(i=i)


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
        # a few ranks sit on slow hosts (data loading), the rest wait on the host a little
        self.host_base = np.clip(self.rng.beta(2, 30, W), 0, 1)
        slow = self.rng.choice(W, size=max(1, W // 16), replace=False)
        self.host_base[slow] += 0.2
        self.pending: dict[int, pb.PlacementPlan] = {}
        self.received: dict[int, set[int]] = {}
        self.step = 0
        self.history: list[tuple[int, float, float]] = []  # (step, balancedness, step time)
        self.links: list[RankLink] = []

    def job_spec(self) -> pb.JobSpec:
        o = self.o
        return pb.JobSpec(job_id=o.job_id, layers=o.layers, experts=o.experts, top_k=o.top_k,
                          world_size=o.world_size, slots_per_rank=self.slots,
                          ranks_per_node=o.gpus_per_node)

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
        log.info("step %d: applied plan epoch %d", self.step, epoch)
        self._report(epoch, pb.PLAN_STATE_APPLIED, self.step)

    def _report(self, epoch: int, state: int, step: int, error: str = "") -> None:
        for link in self.links:
            link.send(pb.RankMessage(plan_report=pb.PlanReport(
                job_id=self.o.job_id, epoch=epoch, state=state, step=step, error=error)))

    def run_step(self) -> tuple[float, Callable[[], None]]:
        """Simulate one step on every rank; returns its step time and ``report()``, which
        queues every rank's report (call it when the step has ended)."""
        o = self.o
        self._maybe_switch()
        counts = self.model.step()                      # [W, L, E]
        # [L, W] tokens per rank, each expert's tokens routed among its replicas as the SDK does
        per_gpu = routed_gpu_loads(
            route_replicas(counts.sum(axis=0), self.phy2log, gpus=o.world_size), o.world_size)
        balance = balancedness(per_gpu)
        t = step_time_s(o.step_time_s, balance) * float(self.rng.uniform(0.98, 1.02))
        # ranks with less expert work wait longer for the slowest one; that is not host time
        host = np.clip(self.host_base + self.rng.normal(0, 0.01, o.world_size), 0, 1)
        step = self.step

        def report() -> None:
            now = self.clock()
            for link in self.links:
                r = link.rank
                link.send(pb.RankMessage(step=pb.RankStep(
                    step=step, counts=encode_array(counts[r]), timestamp=now,
                    stats=pb.RankStepStats(rank=r, step_time_s=t,
                                           host_bound_ratio=float(host[r]),
                                           tokens=o.tokens_per_step))))

        self.history.append((step, balance, t))
        self.step += 1
        return t, report

    async def run(self, stop: asyncio.Event) -> None:
        o = self.o
        channels = [grpc.aio.insecure_channel(
            "unix:" + o.socket_template.format(node=o.node_id(n), i=n)) for n in range(o.nodes)]
        spec = self.job_spec()
        for r in range(o.world_size):
            n, local = divmod(r, o.gpus_per_node)
            hello = pb.RankHello(job=spec, rank=r, device_id=f"{o.node_id(n)}/gpu{local}")
            self.links.append(RankLink(channels[n], hello, self._on_plan, seed=o.seed + r))
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
