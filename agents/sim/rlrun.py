"""``moeplane simulate --rl MODE``: a simulated RL job's ranks send their phase spans to their
node agents, step by step, in real time (scaled).

The spans come from :func:`moeplane.agents.sim.rl.simulate`; times are shifted to now and
scaled so that a mean step lasts ``step_time_s``. Rank ``r`` is the simulated device ``r``;
it attaches to the agent of node ``r // gpus_per_node`` over ``NodeLocal`` (like a training
rank's SDK) and sends each step's spans when the step has ended, with the step's weight sync
and consumed batch from rank 0. The policy is an MoE (``policy``: [L, E], top-k): each rank
also sends its expert loads of the step's ``generate`` and ``train_update`` phases
(:mod:`moeplane.agents.sim.rl_loads`: rollout routes differently from training).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import grpc
import numpy as np

from moeplane.agents.rlreport import phase_loads, rl_report
from moeplane.agents.sim.ranklink import RankLink
from moeplane.agents.sim.rl import RLSimConfig, simulate
from moeplane.agents.sim.rl_loads import MoEPolicy
from moeplane.agents.sim.rl_loads import phase_loads as simulated_loads
from moeplane.controlplane.wire import moeplane_pb2 as pb

log = logging.getLogger(__name__)

LINGER_S = 2.0  # after the last step, before the rank streams close


@dataclass(frozen=True)
class RLRunOptions:
    job_id: str
    mode: str
    staleness: int = 1
    nodes: int = 1
    gpus_per_node: int = 8
    steps: int = 20
    step_time_s: float = 1.0
    seed: int = 0
    socket_template: str = "/tmp/moeplane-agent-{node}.sock"
    node_template: str = "node-{i}"
    attach_timeout_s: float = 60.0
    policy: MoEPolicy = MoEPolicy()


async def run_rl(o: RLRunOptions, stop: asyncio.Event) -> None:
    devices = o.nodes * o.gpus_per_node
    cfg = RLSimConfig(mode=o.mode, staleness=o.staleness, devices=devices, steps=o.steps, seed=o.seed,
                      rollout_devices=max(1, round(devices * 3 / 8)) if devices > 1 else 1)
    sim = simulate(cfg)
    loads: dict[tuple[int, int], list] = {}  # (step, rank) -> [(phase, counts [L, E])]
    for step, rank, name, counts in simulated_loads(sim.spans, cfg, o.policy, seed=o.seed):
        loads.setdefault((step, rank), []).append((name, counts))
    scale = o.step_time_s / float(sim.wall.mean()) if o.step_time_s > 0 else 0.0
    s = sim.spans
    channels, links = [], []
    for i in range(o.nodes):
        node = o.node_template.format(i=i)
        ch = grpc.aio.insecure_channel(f"unix:{o.socket_template.format(node=node, i=i)}")
        channels.append(ch)
        for g in range(o.gpus_per_node):
            rank = i * o.gpus_per_node + g
            hello = pb.RankHello(job=pb.JobSpec(job_id=o.job_id, layers=o.policy.layers, experts=o.policy.experts,
                                                top_k=o.policy.top_k, world_size=devices, slots_per_rank=1,
                                                ranks_per_node=o.gpus_per_node), rank=rank)
            links.append(RankLink(ch, hello, lambda _r, _p: None, seed=o.seed + rank))
    for link in links:
        link.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(link.attached.wait() for link in links)), o.attach_timeout_s)
        now = time.time()  # the job starts once every rank is attached
        start = now + (s.start - float(s.start.min())) * scale
        end = now + (s.end - float(s.start.min())) * scale
        step_end = np.array([end[s.step == k].max() for k in range(o.steps)])
        for k in range(o.steps):
            delay = step_end[k] - time.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            for link in links:
                mine = (s.step == k) & (s.rank == link.rank)
                spans = s.take(mine)
                spans = type(spans)(spans.step, spans.rank, spans.version, spans.phase, spans.role, start[mine],
                                    end[mine], spans.tokens)
                batches = [pb.ConsumedBatch(step=k, rank=-1, trained_version=k, samples=0, lag_min=int(sim.lag[k]),
                                            lag_mean=float(sim.lag[k]), lag_max=int(sim.lag[k]), bound=o.staleness,
                                            timestamp=float(step_end[k]))] if link.rank == 0 else []
                mine_loads = [phase_loads(k, link.rank, name, counts, float(step_end[k]))
                              for name, counts in loads.get((k, link.rank), [])]
                link.send(pb.RankMessage(rl=rl_report(o.job_id, spans, batches=batches, loads=mine_loads)))
            log.info("RL step %d sent (%s)", k, o.mode)
        await asyncio.gather(*(link.drain(10.0) for link in links))
        # the agent reads what was written before the streams close (it sends no acks to ranks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LINGER_S)
    finally:
        for link in links:
            await link.close()
        for ch in channels:
            await ch.close()
