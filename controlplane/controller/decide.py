"""When to rebalance, and what: pure. Snapshot in, Decision out; time is an argument.

Rebalance when (1) at least ``min_interval_s`` passed since the last plan, (2) the running
placement was imbalanced (> threshold) in each of the last ``sustain_steps`` steps, and (3) the
predicted step-time gain over ``horizon_steps`` exceeds the migration stall. Layers whose
balancedness would improve by less than ``min_layer_gain`` keep their current placement.

Cost model: expert time per step ∝ max rank load = mean load × balancedness, so a change of
balancedness from b0 to b1 saves ``step_time × moe_time_fraction × (1 − b1/b0)`` per step.
b0 and b1 are what the job will measure under the running and the new placement: the mean
routed balancedness (each step's tokens routed among the replicas) over the steps the new
plan will be measured on (``balancing.prediction.measured_steps``), estimated out of sample
from the recent window's steps (``balancing.expected_balancedness``: the window's drift and
noise carried forward; a placement is not scored on the steps it was fitted to).
Migration stalls every rank until the busiest destination rank has received its copies:
``max over ranks of (intra copies × bytes / intra bw + cross copies × bytes / cross bw)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from moeplane.controlplane.balancing import (
    count_moves,
    ema_forecast,
    plan_placement,
)
from moeplane.controlplane.balancing.prediction import expected_balancedness, measured_steps
from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy


class Action(StrEnum):
    HOLD = "hold"
    REBALANCE = "rebalance"


@dataclass(frozen=True)
class Decision:
    """What the controller should do now.

    phy2log [L, G*S] int64 (REBALANCE only): the placement to push.
    layers: the layers whose placement changes.
    predicted_before / predicted_after: balancedness the job is predicted to measure, before
    and after: the mean routed balancedness over the steps the plan will be measured on.
    gain_s / cost_s: predicted step time saved over the horizon vs. migration stall, seconds.
    """

    action: Action
    reason: str
    phy2log: np.ndarray | None = None
    layers: tuple[int, ...] = ()
    predicted_before: float | None = None
    predicted_after: float | None = None
    moves: int = 0
    cross_node_moves: int = 0
    gain_s: float = 0.0
    cost_s: float = 0.0


def migration_stall_s(
    transfers: np.ndarray, cross_node: np.ndarray, slots_per_rank: int, world_size: int, policy: RebalancePolicy
) -> float:
    """Seconds until the busiest destination rank has its copies.

    transfers [M, 4] int64 rows (layer, destination slot, logical expert, source rank);
    cross_node [M] bool.
    """
    if len(transfers) == 0:
        return 0.0
    dst = transfers[:, 1] // slots_per_rank
    intra = np.bincount(dst[~cross_node], minlength=world_size)
    cross = np.bincount(dst[cross_node], minlength=world_size)
    per_rank = (
        intra * policy.expert_bytes / policy.intra_node_bytes_per_s
        + cross * policy.expert_bytes / policy.cross_node_bytes_per_s
    )
    return float(per_rank.max())


def decide(
    *,
    recent_balancedness: np.ndarray,
    predicted: np.ndarray,
    current: np.ndarray,
    world_size: int,
    slots_per_rank: int,
    nodes: int,
    step_time_s: float,
    now: float,
    last_plan_at: float | None,
    policy: RebalancePolicy,
    planner: Callable = plan_placement,
    window: np.ndarray | None = None,
    groups: int | None = None,
) -> Decision:
    """Decide for one job.

    Args:
        recent_balancedness [W]: measured balancedness of the running placement, oldest first.
        predicted [L, E]: predicted tokens per logical expert for the coming steps (planned for).
        window [W, L, E]: the recent steps' tokens per logical expert, oldest first, from which
            the balancedness before and after is predicted (default: ``predicted`` alone, as one
            step without drift or noise).
        current [L, G*S] int64: the running placement.
        world_size, slots_per_rank, nodes: G, S and the node count (G divisible by nodes).
        step_time_s: recent mean step time, seconds.
        now, last_plan_at: unix seconds; ``last_plan_at`` None when the job has no plan yet.
        groups: the job's K expert groups (``plan_placement(groups=K)``: every replica of a
            group on its group's node); None: no groups.
    """
    if last_plan_at is not None and now - last_plan_at < policy.min_interval_s:
        return Decision(Action.HOLD, f"last plan {now - last_plan_at:.1f}s ago (< {policy.min_interval_s}s)")
    tail = np.asarray(recent_balancedness, dtype=np.float64)[-policy.sustain_steps :]
    if len(tail) < policy.sustain_steps:
        return Decision(Action.HOLD, f"{len(tail)} steps observed (< {policy.sustain_steps})")
    if (tail <= policy.imbalance_threshold).any():
        return Decision(
            Action.HOLD,
            f"balancedness {tail[-1]:.3f} not above {policy.imbalance_threshold} for {policy.sustain_steps} steps",
        )
    if groups and policy.max_moves is not None:
        return Decision(Action.HOLD, f"groups = {groups}: the policy's max_moves is not supported with groups")
    plan = planner(
        predicted, gpus=world_size, slots_per_gpu=slots_per_rank, nodes=nodes, current=current,
        max_moves=policy.max_moves, search=policy.search, groups=groups or None,
    )
    steps = np.asarray(predicted, dtype=np.float64)[None] if window is None else window
    ahead = measured_steps(policy.min_interval_s, step_time_s)
    before, after = expected_balancedness(steps, [current, plan.phy2log], gpus=world_size, ahead=ahead)
    keep = (before - after) >= policy.min_layer_gain
    if not keep.any():
        return Decision(Action.HOLD, f"no layer gains {policy.min_layer_gain} or more", predicted_before=float(before.mean()))
    new = np.where(keep[:, None], plan.phy2log, current).astype(np.int64)
    kept_rows = np.isin(plan.transfers[:, 0], np.flatnonzero(keep)) if len(plan.transfers) else np.zeros(0, bool)
    transfers = plan.transfers[kept_rows]
    cross = plan.cross_node[kept_rows]
    b0 = float(before.mean())
    b1 = float(np.where(keep, after, before).mean())
    gain = policy.horizon_steps * step_time_s * policy.moe_time_fraction * (1.0 - b1 / b0)
    cost = migration_stall_s(transfers, cross, slots_per_rank, world_size, policy)
    moves = int(count_moves(current, new, world_size, predicted.shape[1]).sum())
    common = dict(
        predicted_before=b0, predicted_after=b1, moves=moves, cross_node_moves=int(cross.sum()),
        gain_s=gain, cost_s=cost, layers=tuple(int(x) for x in np.flatnonzero(keep)),
    )
    if gain <= cost:
        return Decision(Action.HOLD, f"gain {gain:.3f}s over horizon <= migration stall {cost:.3f}s", **common)
    return Decision(
        Action.REBALANCE,
        f"balancedness {b0:.3f} -> {b1:.3f} on {int(keep.sum())} layers; gain {gain:.2f}s > stall {cost:.2f}s",
        phy2log=new,
        **common,
    )


def ema(window: np.ndarray, alpha: float = 0.3) -> np.ndarray:
    """The planner's input: the exponential moving average of ``window [W, L, E]`` (oldest
    first) -> float64 ``[L, E]`` (``balancing.ema_forecast``). Replayed on the drifting traces
    and a real run (``benchmarks/replay_forecast.py``, docs/bench-routing.md), alpha 0.3 ties
    EMA 0.5 and the forecaster chosen by one-step-ahead error, and beats the window's mean and
    Holt's trend."""
    return ema_forecast(window, alpha=alpha)
