"""The simulated MoE policy's expert loads by phase: tokens from the spans' durations and
rates, and rollout routed unlike training."""

from __future__ import annotations

import numpy as np

from moeplane.agents.sim.rl import RLSimConfig, simulate
from moeplane.agents.sim.rl_loads import MoEPolicy, phase_loads
from moeplane.controlplane.rl.loads import summarize
from moeplane.controlplane.rl.phases import PHASE_CODE


def test_loads_follow_the_spans_and_rollout_routes_unlike_training():
    cfg = RLSimConfig(mode="async", staleness=1, devices=8, steps=4)
    sim = simulate(cfg)
    policy = MoEPolicy(layers=4, experts=16, top_k=2)
    loads = phase_loads(sim.spans, cfg, policy)
    s = sim.spans
    for name, rate in (("generate", cfg.gen_tokens_per_s), ("train_update", cfg.train_tokens_per_s)):
        rows = [(step, rank, c) for step, rank, p, c in loads if p == name]
        keys = {(step, rank) for step, rank, _ in rows}
        mine = s.phase == PHASE_CODE[name]
        assert keys == set(zip(s.step[mine].tolist(), s.rank[mine].tolist(), strict=True))
        for step, rank, c in rows:
            seconds = float((s.end - s.start)[mine & (s.step == step) & (s.rank == rank)].sum())
            assert c.shape == (4, 16)
            assert c.sum(axis=1).tolist() == [round(seconds * rate) * 2] * 4
    total = {name: sum(c for _, _, p, c in loads if p == name) for name in ("generate", "train_update")}
    gen, train = summarize(np.array([PHASE_CODE["generate"], PHASE_CODE["train_update"]]),
                           np.stack([total["generate"], total["train_update"]]))
    assert gen["max_over_mean_avg"] > 1.5 * train["max_over_mean_avg"]
    assert (gen["share"].argmax(axis=1) != train["share"].argmax(axis=1)).any()  # other hot experts
    assert phase_loads(sim.spans, cfg, policy)[0][3].tolist() == loads[0][3].tolist()  # seeded
