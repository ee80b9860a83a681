"""Training replay for the planner benchmark: expert time per step plus migration stall.

A placement starts as EPLB's plan of the first ``warmup`` steps. Every step's time is the
expert compute of its slowest GPU per layer (max GPU tokens x ``SECONDS_PER_TOKEN``, summed
over layers); a re-plan stalls the job for the most expert copies any one rank receives x
``SECONDS_PER_MOVE`` (each copy: 3 x 7680 x 2048 parameters at 16 bytes - weights, fp32
master and Adam moments - over 25 GB/s per rank).

Policies (``k`` = re-plan period in steps; "mean of 20" = mean of the last 20 steps):
  ours@10        plan_placement(mean of 20, current=placement), default settings (headline);
  ours@10 relieve the same with ``search="relieve"``, most loaded GPUs first (extra row);
  ours@10+fc     the same, fed the forecaster with the least one-step-ahead error on the last
                 ``FC_HISTORY`` steps among ``FORECASTERS`` (extra row, not the headline);
  eplb@10/@50    EPLB's greedy from the mean of 20, every 10 / 50 steps;
  once           EPLB's plan of the first ``warmup`` steps, kept;
  free@10        a fresh plan from the mean of 20 every 10 steps, moves charged nothing: a
                 bound for any policy on the headline's schedule and input;
  free@10+fc     the same from the forecast: the bound for ours@10+fc;
  ours@10 b=X%   ours@10 with ``max_moves`` = X% of the slots per re-plan (``budgets``; extra
                 rows: the move/balance trade-off a budget buys on the same schedule).
Every policy also reports ``even_stall``: its stall had each re-plan's copies been spread
evenly over the ranks (ceil(copies / G) per rank), i.e. what receipt-aware placement of the
same moves could at best save.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.balancing import (
    FORECASTERS,
    choose_forecaster,
    eplb_greedy,
    forecast,
    fresh_placement,
    gpu_expert_counts,
    gpu_loads,
    plan_placement,
)

EXPERT_PARAMS = 3 * 7680 * 2048
SECONDS_PER_TOKEN = 6 * EXPERT_PARAMS / 400e12  # 6 FLOPs per parameter and token, 400 TFLOP/s
SECONDS_PER_MOVE = EXPERT_PARAMS * 16 / 25e9
FC_HISTORY = 60  # steps the forecaster is chosen and run on


def received_per_gpu(old, new, gpus, experts):
    """Expert copies each GPU receives going from ``old`` to ``new`` ([L, G*S]): int ``[G]``."""
    before = gpu_expert_counts(old, gpus, experts) > 0
    after = gpu_expert_counts(new, gpus, experts) > 0
    return (after & ~before).sum(axis=(0, 2))


def _forecast(history):
    h = history[-FC_HISTORY:]
    method, params = FORECASTERS[choose_forecaster(h, warmup=min(20, len(h) - 1))]
    return forecast(h, method=method, **params), method, params


def run_schedule(trace, start, gpus, period, plan, inputs, *, warmup=20, charge=True,
                 on_replan=None):
    """One policy on ``trace [T, L, E]`` from placement ``start [L, G*S]``: steps ``warmup``
    .. T-1, re-planning every ``period`` steps with ``plan(inputs(t, picked), placement)``
    (``plan`` None: keep ``start``); moves cost stall only when ``charge``. ``on_replan(t,
    w, new)`` sees each re-plan's input and placement. Returns {compute, stall, even_stall,
    total (s per step), moves, picked (what ``inputs`` recorded)}."""
    experts = trace.shape[2]
    phy = start
    compute = stall = even = 0.0
    total_moves = 0
    picked: dict[str, int] = {}
    for t in range(warmup, trace.shape[0]):
        if plan is not None and t > warmup and (t - warmup) % period == 0:
            w = inputs(t, picked)
            new = plan(w, phy)
            received = received_per_gpu(phy, new, gpus, experts)
            stall += received.max() * SECONDS_PER_MOVE * charge
            even += -(-int(received.sum()) // gpus) * SECONDS_PER_MOVE * charge
            total_moves += int(received.sum())
            phy = new
            if on_replan is not None:
                on_replan(t, w, new)
        compute += gpu_loads(trace[t], phy, gpus).max(axis=1).sum() * SECONDS_PER_TOKEN
    n = trace.shape[0] - warmup
    return {"compute": compute / n, "stall": stall / n, "total": (compute + stall) / n,
            "even_stall": even / n, "moves": total_moves, "picked": picked}


def window_mean(trace, window):
    """``inputs`` for ``run_schedule``: at step t, the mean of steps t-``window`` .. t-1 of
    ``trace [T, L, E]`` (tokens per expert, ``[L, E]``)."""
    def inputs(t, picked):
        return trace[t - window : t].mean(axis=0)
    return inputs


def incremental_policy(gpus, spg, nodes, **settings):
    """``plan`` for ``run_schedule``: our planner from the placement in force, with
    ``settings`` beyond the defaults."""
    def plan(w, phy):
        return np.asarray(plan_placement(w, gpus=gpus, slots_per_gpu=spg, nodes=nodes,
                                         current=phy, **settings).phy2log)
    return plan


def eplb_policy(gpus, spg):
    """``plan`` for ``run_schedule``: EPLB's greedy from scratch."""
    return lambda w, phy: eplb_greedy(w, gpus, spg)


def fresh_policy(gpus, spg):
    """``plan`` for ``run_schedule``: our fresh placement, ignoring the one in force."""
    return lambda w, phy: fresh_placement(w, gpus, spg)


def replay(trace, gpus, spg, nodes, warmup=20, window=20, budgets=()):
    """Every policy on ``trace [T, L, E]``: {name: {compute, stall, even_stall, total (s per
    step), moves, picked (forecasters chosen, for the +fc rows)}}. ``budgets``: shares of the
    slots for the extra ``ours@10 b=X%`` rows."""
    start = eplb_greedy(trace[:warmup].mean(axis=0), gpus, spg)

    def run(period, plan, inputs, charge=True):
        return run_schedule(trace, start, gpus, period, plan, inputs, warmup=warmup,
                            charge=charge)

    mean_of_window = window_mean(trace, window)

    def forecast_input(t, picked):
        f, method, params = _forecast(trace[:t])
        key = method + "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
        picked[key] = picked.get(key, 0) + 1
        return f

    ours = incremental_policy(gpus, spg, nodes)
    eplb = eplb_policy(gpus, spg)
    fresh = fresh_policy(gpus, spg)

    slots = trace.shape[1] * gpus * spg
    extra = {f"ours@10 b={share:.0%}": run(
                 10, incremental_policy(gpus, spg, nodes, max_moves=int(share * slots)),
                 mean_of_window)
             for share in budgets}
    return extra | {
        "ours@10": run(10, ours, mean_of_window),
        "ours@10 relieve": run(10, incremental_policy(gpus, spg, nodes, search="relieve"),
                               mean_of_window),
        "ours@10+fc": run(10, ours, forecast_input),
        "eplb@10": run(10, eplb, mean_of_window),
        "eplb@50": run(50, eplb, mean_of_window),
        "once": run(10, None, mean_of_window),
        "free@10": run(10, fresh, mean_of_window, charge=False),
        "free@10+fc": run(10, fresh, forecast_input, charge=False),
    }
