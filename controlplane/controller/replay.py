"""Replay of the controller's own policy over a recorded load trace (pure: an injected clock,
no I/O).

``replay_trace(trace [T, L, E], ...)`` runs, step by step from ``warmup`` on:

- ``controller``: the controller's decision code as the runner calls it (``decide.decide``
  with the EMA of the window as the planner's input, the window's steps for the prediction,
  the policy's trigger, interval and gain-versus-stall rule); the clock is the replayed job's
  own time (steps and stalls). Each step's tokens are routed among the replicas
  (``route_replicas``), as the SDK does;
- ``once``: EPLB's plan of the warm-up steps, kept; ``eplb@10``, ``eplb@50``: EPLB's greedy
  of the mean of the last ``window_steps`` steps every 10 / 50 steps (tokens split evenly, as
  EPLB does);
- ``oracle``: a fresh plan of every step's own loads, routed, moves free: a bound.

With ``groups`` = K (the job's expert groups, each kept on one node), the controller plans
with ``groups``, EPLB is its hierarchical policy (``groups.eplb_hierarchical``) and the oracle
a fresh grouped plan.

Cost model (the planner benchmark's): a step's expert time is, summed over layers, the most
loaded GPU's tokens x ``seconds_per_token``; a new placement stalls the job for
``migration_stall_s`` (the busiest destination rank's copies x ``expert_bytes`` over the
policy's intra- and cross-node bandwidth).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from moeplane.controlplane.balancing import (
    eplb_greedy,
    fresh_placement,
    gpu_loads,
    layer_balancedness,
    plan_placement,
    routed_balancedness,
)
from moeplane.controlplane.balancing.groups import eplb_hierarchical
from moeplane.controlplane.balancing.routing import route_with, routing_table
from moeplane.controlplane.balancing.transfers import plan_transfers
from moeplane.controlplane.controller.decide import Action, decide, ema, migration_stall_s
from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy

__all__ = ["SECONDS_PER_TOKEN", "PolicyRun", "replay_trace"]

# 6 FLOPs per parameter and token of a 3 x 7680 x 2048 expert at 400 TFLOP/s (planner bench)
SECONDS_PER_TOKEN = 6 * 3 * 7680 * 2048 / 400e12


@dataclass
class PolicyRun:
    """One policy's replay: ``expert_s [n]`` expert seconds of each replayed step; ``stall_s``
    total migration stall; ``plans`` placements adopted; ``moves`` expert copies."""

    expert_s: list[float] = field(default_factory=list)
    stall_s: float = 0.0
    plans: int = 0
    moves: int = 0

    def summary(self) -> dict:
        n = max(len(self.expert_s), 1)
        expert = float(np.sum(self.expert_s))
        return {
            "expert_s_per_step": expert / n,
            "stall_s_per_step": self.stall_s / n,
            "total_s_per_step": (expert + self.stall_s) / n,
            "plans": self.plans,
            "moves": self.moves,
            "expert_s": [round(x, 6) for x in self.expert_s],
        }


def _routed_gpus(step: np.ndarray, table) -> np.ndarray:
    """Each GPU's tokens per layer, tokens routed: ``step [L, E]`` -> int64 ``[L, G]``."""
    st = route_with(table, np.rint(step).astype(np.int64))
    return st.reshape(table.layers, table.gpus, -1).sum(axis=2)


def _routed_peak(step: np.ndarray, table) -> np.ndarray:
    """Most loaded GPU's tokens per layer, tokens routed: ``step [L, E]`` -> ``[L]``."""
    return _routed_gpus(step, table).max(axis=1)


def _stall(old, new, gpus, spg, nodes, policy) -> tuple[float, int]:
    transfers, cross = plan_transfers(old, new, gpus, old.max() + 1, nodes)
    return migration_stall_s(transfers, cross, spg, gpus, policy), len(transfers)


def replay_trace(
    trace: np.ndarray,
    *,
    gpus: int,
    slots_per_gpu: int,
    nodes: int = 1,
    policy: RebalancePolicy | None = None,
    warmup: int = 20,
    seconds_per_token: float = SECONDS_PER_TOKEN,
    groups: int | None = None,
    forecaster: Callable[[np.ndarray], np.ndarray] = ema,
) -> dict:
    """Replay every policy on ``trace [T, L, E]`` (tokens per step, layer and expert; T >
    ``warmup`` >= 1). Returns ``{"steps", "policies": {name: PolicyRun.summary()},
    "speedup": {"vs_best_eplb", "vs_once"}}`` (speed-up: the baseline's total time per step
    over the controller's). ``groups``: K expert groups, each kept on one node (None: none).
    ``forecaster``: the controller's planner input from the window ``[W, L, E]`` -> ``[L, E]``
    (default: the runner's)."""
    policy = policy or RebalancePolicy()
    trace = np.asarray(trace, dtype=np.float64)
    steps, layers, experts = trace.shape
    spg = slots_per_gpu
    window = policy.window_steps

    def eplb(loads):
        if groups:
            return eplb_hierarchical(loads, gpus, spg, nodes, groups)
        return eplb_greedy(loads, gpus, spg)

    def oracle(loads):
        if groups:
            return plan_placement(loads, gpus=gpus, slots_per_gpu=spg, nodes=nodes,
                                  groups=groups).phy2log
        return fresh_placement(loads, gpus, spg)

    start = eplb(trace[:warmup].mean(axis=0))
    runs = {name: PolicyRun() for name in ("controller", "once", "eplb@10", "eplb@50", "oracle")}
    held = {"once": start, "eplb@10": start, "eplb@50": start}
    cur, last_plan_at, now = start, None, 0.0
    table = routing_table(start, gpus=gpus, num_experts=experts)
    measured: dict[int, float] = {}  # step -> its routed balancedness under ``cur``
    for t in range(warmup, steps):
        lo = max(0, t - window)
        for name, period in (("eplb@10", 10), ("eplb@50", 50)):
            if (t - warmup) % period == 0 and t > warmup:
                new = eplb(trace[lo:t].mean(axis=0))
                stall, moves = _stall(held[name], new, gpus, spg, nodes, policy)
                runs[name].stall_s += stall
                runs[name].moves += moves
                runs[name].plans += 1
                held[name] = new
        for name in held:
            peak = gpu_loads(trace[t], held[name], gpus).max(axis=1)
            runs[name].expert_s.append(float(peak.sum()) * seconds_per_token)
        # the controller: decide on the steps before t, adopt at t
        past = trace[lo:t]
        # each step's measured balancedness under the placement in force: a step run under it
        # was measured as it ran (below); the window's steps before it was adopted, here
        missing = [k for k in range(lo, t) if k not in measured]
        if missing:
            measured.update(zip(missing, routed_balancedness(trace[missing], cur, gpus=gpus)
                                .mean(axis=1).tolist(), strict=True))
        bal = np.array([measured[k] for k in range(lo, t)])
        step_time = float(np.mean(runs["controller"].expert_s[-window:] or [1.0])) / \
            policy.moe_time_fraction
        decision = decide(
            recent_balancedness=bal, predicted=forecaster(past), current=cur, world_size=gpus,
            slots_per_rank=spg, nodes=nodes, step_time_s=step_time, now=now,
            last_plan_at=last_plan_at, policy=policy, window=past, groups=groups,
        )
        run = runs["controller"]
        if decision.action == Action.REBALANCE:
            run.stall_s += decision.cost_s
            run.moves += decision.moves
            run.plans += 1
            cur, last_plan_at = decision.phy2log, now
            table = routing_table(cur, gpus=gpus, num_experts=experts)
            measured = {}
            now += decision.cost_s
        per_gpu = _routed_gpus(trace[t], table)
        measured[t] = float(layer_balancedness(per_gpu.astype(np.float64)).mean())
        expert_s = float(per_gpu.max(axis=1).sum()) * seconds_per_token
        run.expert_s.append(expert_s)
        now += expert_s / policy.moe_time_fraction
        best = oracle(trace[t])
        runs["oracle"].expert_s.append(
            float(_routed_peak(trace[t], routing_table(best, gpus=gpus, num_experts=experts))
                  .sum()) * seconds_per_token)
    out = {name: run.summary() for name, run in runs.items()}
    ours = out["controller"]["total_s_per_step"]
    best_eplb = min(out["eplb@10"]["total_s_per_step"], out["eplb@50"]["total_s_per_step"])
    return {
        "steps": steps - warmup,
        "layers": layers,
        "experts": experts,
        "groups": groups,
        "policies": out,
        "speedup": {
            "vs_best_eplb": best_eplb / ours,
            "vs_once": out["once"]["total_s_per_step"] / ours,
        },
    }
