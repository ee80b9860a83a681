"""Study, not the planner: how far any stopping level and receipt spread can take the replay.

    .venv/bin/python benchmarks/planner_replay_frontier.py [--cases 64x5,32x9]
                                                           [--tolerances 0,0.01,0.02,0.03,0.05]

On the sim family's replay (seed 0, 300 steps, the schedule of ``planner_replay.py``: re-plan
every 10 steps from the mean of the last 20), for each case:

1. **Frontier.** ours@10 at each ``tolerance`` (the default is 0.01, which the incremental
   target fixes): compute, stall, total, and the total had each re-plan's copies been spread
   evenly over the ranks (``even``), against what the targets need: best EPLB schedule / 1.12
   and tuned-once / 1.2 (seconds per step).
2. **Served steps.** For ours@10 (default settings) and a fresh plan on the same schedule
   (``free@10``): predicted balancedness of each plan on its input, realized balancedness over
   the 10 steps it serves, the spread of each expert's load over those steps against its
   input (``growth sd``: sd of next-10-step share / input share), the spread of each GPU's
   realized load against its predicted load (``GPU err sd``, in units of the mean GPU load)
   and ``q2``, the mean over GPUs of sum over its slots of (tokens per replica)^2 / (mean GPU
   load)^2, ``q2 same-GPU``, the same with the replicas of an expert on one GPU summed first
   ((replicas on the GPU x tokens per replica)^2: what a GPU's spread follows when it holds
   several replicas of one expert, which drift together), and ``dup``, the (layer, GPU,
   expert) triples per plan where a GPU holds two or more replicas of one expert. If experts
   drift independently, ``GPU err sd`` = growth sd x sqrt(q2 same-GPU); q2 depends on the
   replica counts only.

Prints markdown tables (docs/bench-planner.md, eighth and ninth rounds). About 1 minute for
both cases.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.planner_replay import (  # noqa: E402
    eplb_policy,
    fresh_policy,
    incremental_policy,
    run_schedule,
    window_mean,
)
from benchmarks.planner_traces import workload_trace  # noqa: E402
from moeplane.controlplane.balancing import (  # noqa: E402
    eplb_greedy,
    gpu_expert_counts,
    gpu_loads,
    layer_balancedness,
    replica_counts,
)

CASES = {"64x5": (64, 5, 8), "32x9": (32, 9, 4)}  # 58x256 on gpus x slots, nodes
LAYERS, EXPERTS, TOP_K, STEPS, WARMUP, WINDOW, PERIOD = 58, 256, 8, 300, 20, 20, 10


def run(trace, start, gpus, plan, period=PERIOD, charge=True, served=None):
    """Seconds per step of a policy on ``trace [T, L, E]`` (``run_schedule`` from ``start``,
    EPLB's plan of the warm-up steps): {compute, stall, even, total}, ``even`` the total had
    each re-plan's copies been spread evenly. ``plan(w, phy) -> phy`` re-plans every
    ``period`` steps from the mean of the last ``WINDOW`` (None: keep ``start``). ``served``:
    a list that receives, per re-plan, (input w [L, E], placement [L, N], loads of the served
    steps [k, L, E])."""
    def record(t, w, new):
        served.append((w, new, trace[t : t + period]))

    r = run_schedule(trace, start, gpus, period, plan, window_mean(trace, WINDOW),
                     warmup=WARMUP, charge=charge,
                     on_replan=None if served is None else record)
    return {"compute": r["compute"], "stall": r["stall"],
            "even": r["compute"] + r["even_stall"], "total": r["total"]}


def served_stats(served, gpus):
    """Predicted and realized balancedness, growth sd, GPU err sd, q2, q2 same-GPU and dup
    (module docstring) over the re-plans of one policy."""
    pred, real, growth, err, q2, q2g, dup = [], [], [], [], [], [], []
    for w, phy, future in served:
        # what each GPU holds of each expert: replicas on it x tokens per replica [L, G, E]
        cnt = gpu_expert_counts(phy, gpus, w.shape[1])
        share = (w / replica_counts(phy, w.shape[1]))[:, None, :]
        mu = (cnt * share).sum(axis=2)  # predicted tokens per GPU [L, G]
        m = mu.mean(axis=1, keepdims=True)
        pred.append(layer_balancedness(mu).mean())
        q2.append(((cnt * share**2).sum(axis=2) / m**2).mean())
        q2g.append((((cnt * share) ** 2).sum(axis=2) / m**2).mean())
        dup.append(int((cnt >= 2).sum()))
        nxt = future.mean(axis=0)
        ratio = (nxt / nxt.sum(axis=1, keepdims=True)) / (w / w.sum(axis=1, keepdims=True))
        growth.append(ratio[w > 0].std())
        for loads in future:
            r = gpu_loads(loads, phy, gpus)
            real.append(layer_balancedness(r).mean())
            err.append((r / r.mean(axis=1, keepdims=True) - mu / m).std())
    return {k: float(np.mean(v)) for k, v in
            (("pred", pred), ("real", real), ("growth", growth), ("err", err), ("q2", q2),
             ("q2g", q2g), ("dup", dup))}


def study_case(case, tolerances):
    """Frontier rows (case, tolerance, run, best EPLB, once) and served-step rows (case,
    policy, served_stats) of one case."""
    gpus, spg, nodes = CASES[case]
    trace = workload_trace(STEPS, LAYERS, EXPERTS, gpus=gpus, top_k=TOP_K)

    start = eplb_greedy(trace[:WARMUP].mean(axis=0), gpus, spg)
    eplb = eplb_policy(gpus, spg)
    best = min(run(trace, start, gpus, eplb, p)["total"] for p in (10, 50))
    once = run(trace, start, gpus, None)["total"]
    frontier = [(case, tol, run(trace, start, gpus,
                                incremental_policy(gpus, spg, nodes, tolerance=tol)), best, once)
                for tol in tolerances]
    stats = []
    for name, plan, charge in (("ours@10", incremental_policy(gpus, spg, nodes, tolerance=0.01),
                                True), ("free@10", fresh_policy(gpus, spg), False)):
        served = []
        run(trace, start, gpus, plan, charge=charge, served=served)
        stats.append((case, name, served_stats(served, gpus)))
    return frontier, stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="64x5,32x9", help="of: " + ", ".join(CASES))
    parser.add_argument("--tolerances", default="0,0.01,0.02,0.03,0.05")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases takes {', '.join(CASES)}, got {args.cases!r}")
    try:
        tolerances = [float(x) for x in args.tolerances.split(",") if x]
    except ValueError:
        parser.error(f"--tolerances takes numbers, got {args.tolerances!r}")
    frontier, stats = [], []
    for case in cases:
        f, st = study_case(case, tolerances)
        frontier += f
        stats += st
        print(f"done {case}", file=sys.stderr, flush=True)

    print("| case | tolerance | compute | stall | total | total if even | best EPLB / 1.12 | "
          "once / 1.2 | best EPLB / even | once / even |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case, tol, r, best, once in frontier:
        print(f"| sim {case} | {tol:g} | {r['compute']:.3f} | {r['stall']:.3f} | "
              f"{r['total']:.3f} | {r['even']:.3f} | {best / 1.12:.3f} | {once / 1.2:.3f} | "
              f"{best / r['even']:.3f} | {once / r['even']:.3f} |")
    print("\n| case | policy | predicted bal | realized bal | growth sd | GPU err sd | q2 | "
          "q2 same-GPU | growth sd x sqrt(q2 same-GPU) | dup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case, name, s in stats:
        print(f"| sim {case} | {name} | {s['pred']:.4f} | {s['real']:.4f} | {s['growth']:.3f} | "
              f"{s['err']:.4f} | {s['q2']:.3f} | {s['q2g']:.3f} | "
              f"{s['growth'] * np.sqrt(s['q2g']):.4f} | {s['dup']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
