"""Planner benchmark: balance, moves, time and a training replay, against EPLB's greedy.

    .venv/bin/python benchmarks/planner.py [--seed 0] [--replay-steps 300] [--families walk,sim]
                                           [--skip-replay] [--replay-budgets 0.03,0.05]

Cases, top-8 routing:
  58x256 on 32 GPUs x 9 slots (4 nodes), 58x256 on 64 GPUs x 5 slots (8 nodes),
  16x64 on 8 GPUs x 10 slots (1 node).
Trace families (``harness/traces.py``), each run on every case:
  walk  independent layers, log-popularity random walk at a constant rate, 5% batch noise,
        16,384 tokens per rank per step;
  sim   the simulator's workload model (``moeplane.agents.sim.workload``, default parameters):
        correlated adjacent layers, hot experts, drift fast early and slow later; tokens per
        rank = the model's default unless ``--sim-tokens-per-rank``.

Measured side by side in one run, per case:
  fresh        plan_placement without current vs eplb_greedy (vectorized) and a loop EPLB;
  incremental  current = EPLB plan of steps [0, 20), loads = mean of steps [50, 70): ours
               (default settings: the repair search) vs a fresh EPLB plan, the
               swap-the-heaviest heuristic and the relieve search (``search="relieve"``);
  budgeted     max_moves = 3% and 6% of slots;
  replay       re-plan every 10 steps from the mean of the last 20 (ours, incremental) vs EPLB
               every 10 / every 50 steps vs an EPLB plan tuned once; time per step = expert
               compute (max GPU tokens x 0.708 us per token-expert: 6 x 3x7680x2048 FLOPs at
               400 TFLOP/s) + stall (most expert copies received by one rank x 755 MB
               (16 bytes per parameter) / 25 GB/s); "free fresh@10" re-plans from scratch
               with moves charged nothing: a bound for any policy on the same schedule.
               Extra rows: the same planner fed a forecast (``planner_replay.py``); the
               stall had each re-plan's copies been spread evenly over the ranks; with
               ``--replay-budgets``, ours@10 with that share of the slots as max_moves.
Prints markdown tables. ``--skip-replay``: only the fresh, incremental and budgeted tables (the
same traces, so the same numbers; the replay takes most of the run's time).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.planner_baselines import eplb_greedy_loop, swap_heaviest  # noqa: E402
from benchmarks.planner_replay import replay  # noqa: E402
from harness.traces import drifting_trace, workload_trace  # noqa: E402
from moeplane.controlplane.balancing import (  # noqa: E402
    count_moves,
    eplb_greedy,
    gpu_loads,
    layer_balancedness,
    plan_placement,
)

CASES = (  # name, layers, experts, gpus, slots per gpu, nodes
    ("58x256 / 32x9", 58, 256, 32, 9, 4),
    ("58x256 / 64x5", 58, 256, 64, 5, 8),
    ("16x64 / 8x10", 16, 64, 8, 10, 1),
)
TOKENS_PER_RANK = 16384  # walk family
TOP_K = 8


def _bal(loads, phy, gpus):
    return layer_balancedness(gpu_loads(loads, phy, gpus))


def _timed_side_by_side(fns, repeat=5):
    """Run ``fns`` in turn ``repeat`` times; last results, median ms, and median ratio of each
    to the first (the ratio of runs made back to back, which the machine's noise spares)."""
    times = np.zeros((repeat, len(fns)))
    outs = [None] * len(fns)
    for r in range(repeat):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            outs[k] = fn()
            times[r, k] = time.perf_counter() - t0
    return outs, np.median(times, axis=0) * 1e3, np.median(times / times[:, :1], axis=0)


def static_cases(trace, layers, experts, gpus, spg, nodes):
    slots = layers * gpus * spg
    old = trace[0:20].mean(axis=0)
    new = trace[50:70].mean(axis=0)
    cur = eplb_greedy(old, gpus, spg)
    (_, ep_new, fresh, inc, rel), ms, ratio = _timed_side_by_side([
        lambda: eplb_greedy_loop(new, gpus, spg),
        lambda: eplb_greedy(new, gpus, spg),
        lambda: plan_placement(new, gpus=gpus, slots_per_gpu=spg, nodes=nodes),
        lambda: plan_placement(new, gpus=gpus, slots_per_gpu=spg, nodes=nodes, current=cur),
        lambda: plan_placement(new, gpus=gpus, slots_per_gpu=spg, nodes=nodes, current=cur,
                               search="relieve"),
    ])
    t_loop, t_ep, t_fresh, t_inc, t_rel = ms
    ep_layer = _bal(new, ep_new, gpus)
    sw = swap_heaviest(new, cur, gpus, ep_layer + 0.01)
    row = {
        "eplb_bal": ep_layer.mean(),
        "fresh_bal": fresh.balancedness_after,
        "t_eplb": t_ep,
        "t_loop": t_loop,
        "t_fresh": t_fresh,
        "stale_bal": _bal(new, cur, gpus).mean(),
        "eplb_moves": count_moves(cur, ep_new, gpus, experts).sum() / slots,
        "inc_bal": inc.balancedness_after,
        "inc_moves": inc.moves / slots,
        "inc_cross": inc.cross_node_moves,
        "t_inc": t_inc,
        "r_fresh": ratio[2],
        "r_inc": ratio[3],
        "rel_bal": rel.balancedness_after,
        "rel_moves": rel.moves / slots,
        "rel_cross": rel.cross_node_moves,
        "t_rel": t_rel,
        "r_rel": ratio[4],
        "swap_bal": _bal(new, sw, gpus).mean(),
        "swap_moves": count_moves(cur, sw, gpus, experts).sum() / slots,
    }
    budgets = []
    for share in (0.03, 0.06):
        k = int(share * slots)
        p = plan_placement(new, gpus=gpus, slots_per_gpu=spg, nodes=nodes, current=cur,
                           max_moves=k)
        budgets.append((share, k, p.moves, p.balancedness_after))
    row["budgets"] = budgets
    return row


def _trace(family, steps, layers, experts, gpus, args):
    if family == "walk":
        return drifting_trace(steps, layers, experts,
                              tokens_per_layer=gpus * TOKENS_PER_RANK * TOP_K, seed=args.seed,
                              batch_noise=args.batch_noise)
    return workload_trace(steps, layers, experts, gpus=gpus, top_k=TOP_K,
                          tokens_per_rank=args.sim_tokens_per_rank, seed=args.seed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay-steps", type=int, default=300)
    parser.add_argument("--families", default="walk,sim",
                        help="comma-separated trace families: walk, sim")
    parser.add_argument("--batch-noise", type=float, default=0.05,
                        help="walk family: per-step multiplicative noise of each expert's "
                             "popularity")
    parser.add_argument("--sim-tokens-per-rank", type=int, default=None,
                        help="sim family: tokens each rank routes per step (default: the "
                             "workload model's default)")
    parser.add_argument("--skip-replay", action="store_true",
                        help="only the fresh, incremental and budgeted tables (no replay)")
    parser.add_argument("--replay-budgets", default="",
                        help="comma-separated shares of the slots (e.g. 0.03,0.05): extra "
                             "replay rows of ours@10 with that max_moves per re-plan")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    try:
        budgets = [float(x) for x in args.replay_budgets.split(",") if x]
    except ValueError:
        parser.error(f"--replay-budgets takes numbers, got {args.replay_budgets!r}")
    if any(not 0 < b <= 1 for b in budgets):
        parser.error(f"--replay-budgets shares must be in (0, 1], got {args.replay_budgets!r}")
    if not families or set(families) - {"walk", "sim"}:
        parser.error(f"--families takes walk and/or sim, got {args.families!r}")

    static_rows = []
    replay_rows = []
    for family in families:
        for name, layers, experts, gpus, spg, nodes in CASES:
            steps = max(args.replay_steps, 70)
            trace = _trace(family, steps, layers, experts, gpus, args)
            label = (name, family)
            static_rows.append((label, static_cases(trace, layers, experts, gpus, spg, nodes)))
            if not args.skip_replay:
                replay_rows.append(
                    (label, replay(trace, gpus, spg, nodes, budgets=budgets)))
            print(f"done {family} {name}", file=sys.stderr, flush=True)
    _print_tables(static_rows, replay_rows)
    return 0


def _best_eplb(row):
    """Seconds per step of the better EPLB schedule (every 10 or every 50 steps)."""
    return min(row["eplb@10"]["total"], row["eplb@50"]["total"])


def _split(v):
    """A policy's seconds per step as "total (compute + stall)"."""
    return f"{v['total']:.3f} ({v['compute']:.3f} + {v['stall']:.3f})"


def _print_tables(static_rows, replay_rows):
    print("### Fresh placement (loads = mean of steps 50-69)\n")
    print("| case | trace | EPLB greedy bal | ours bal | ours - EPLB | EPLB vectorized ms | "
          "EPLB loop ms | ours ms | ours / loop |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, fam), r in static_rows:
        print(f"| {name} | {fam} | {r['eplb_bal']:.4f} | {r['fresh_bal']:.4f} | "
              f"{r['fresh_bal'] - r['eplb_bal']:+.4f} | {r['t_eplb']:.1f} | {r['t_loop']:.1f} | "
              f"{r['t_fresh']:.1f} | {r['r_fresh']:.2f} |")
    print("\n### Incremental after drift (current = EPLB plan of steps 0-19)\n")
    print("| case | trace | stale bal | fresh EPLB bal (moves) | swap-heaviest bal (moves) | "
          "ours bal (moves, cross-node) | ours - fresh EPLB | ours ms | ours / loop EPLB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, fam), r in static_rows:
        print(f"| {name} | {fam} | {r['stale_bal']:.4f} | {r['eplb_bal']:.4f} "
              f"({r['eplb_moves']:.1%}) | {r['swap_bal']:.4f} ({r['swap_moves']:.1%}) | "
              f"{r['inc_bal']:.4f} ({r['inc_moves']:.1%}, {r['inc_cross']}) | "
              f"{r['inc_bal'] - r['eplb_bal']:+.4f} | {r['t_inc']:.1f} | {r['r_inc']:.2f} |")
    print("\n### Incremental after drift, the relieve search (`search=\"relieve\"`, most loaded "
          "GPUs first; same cases)\n")
    print("| case | trace | relieve bal (moves, cross-node) | relieve - fresh EPLB | "
          "ours moves / relieve | relieve ms | relieve / loop EPLB | ours / relieve (time) |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, fam), r in static_rows:
        print(f"| {name} | {fam} | {r['rel_bal']:.4f} ({r['rel_moves']:.1%}, {r['rel_cross']}) | "
              f"{r['rel_bal'] - r['eplb_bal']:+.4f} | {r['inc_moves'] / r['rel_moves']:.2f} | "
              f"{r['t_rel']:.1f} | {r['r_rel']:.2f} | {r['r_inc'] / r['r_rel']:.2f} |")
    print("\n### Budgeted (max_moves = share of slots)\n")
    print("| case | trace | stale bal | budget | moves | bal |")
    print("|---|---|---|---|---|---|")
    for (name, fam), r in static_rows:
        for share, k, moved, bal in r["budgets"]:
            print(f"| {name} | {fam} | {r['stale_bal']:.4f} | {share:.0%} = {k} | {moved} | "
                  f"{bal:.4f} |")
    if not replay_rows:
        return
    print("\n### Training replay (seconds per step: expert compute + stall)\n")
    print("| case | trace | ours@10 | EPLB@10 | EPLB@50 | tuned once | free fresh@10 (bound) | "
          "best EPLB / ours | once / ours | best EPLB / bound | once / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, fam), r in replay_rows:
        best = _best_eplb(r)
        ours, once, free = (r[k]["total"] for k in ("ours@10", "once", "free@10"))
        cells = " | ".join(_split(r[k]) for k in ("ours@10", "eplb@10", "eplb@50", "once"))
        print(f"| {name} | {fam} | {cells} | {free:.3f} | {best / ours:.3f} | "
              f"{once / ours:.3f} | {best / free:.3f} | {once / free:.3f} |")
    print("\n### Replay: stall with each re-plan's copies spread evenly over the ranks\n")
    print("| case | trace | ours@10 stall | ours@10 even stall | ours@10 total if even | "
          "best EPLB / that | once / that |")
    print("|---|---|---|---|---|---|---|")
    for (name, fam), r in replay_rows:
        v = r["ours@10"]
        best = _best_eplb(r)
        even_total = v["compute"] + v["even_stall"]
        print(f"| {name} | {fam} | {v['stall']:.3f} | {v['even_stall']:.3f} | "
              f"{even_total:.3f} | {best / even_total:.3f} | "
              f"{r['once']['total'] / even_total:.3f} |")
    print("\n### Replay, extra rows: ours@10 with the relieve search (`search=\"relieve\"`)\n")
    print("| case | trace | ours@10 | ours@10 relieve | best EPLB / relieve | once / relieve | "
          "copies moved (ours, relieve) |")
    print("|---|---|---|---|---|---|---|")
    for (name, fam), r in replay_rows:
        v, base = r["ours@10 relieve"], r["ours@10"]
        print(f"| {name} | {fam} | {_split(base)} | {_split(v)} | "
              f"{_best_eplb(r) / v['total']:.3f} | {r['once']['total'] / v['total']:.3f} | "
              f"{base['moves']}, {v['moves']} |")
    budget_keys = [k for k in replay_rows[0][1] if " b=" in k]
    if budget_keys:
        print("\n### Replay, extra rows: ours@10 with a move budget per re-plan\n")
        print("| case | trace | policy | s/step (compute + stall) | even-spread total | "
              "best EPLB / ours | once / ours | copies moved |")
        print("|---|---|---|---|---|---|---|---|")
        for (name, fam), r in replay_rows:
            best = _best_eplb(r)
            for k in ["ours@10", *budget_keys]:
                v = r[k]
                print(f"| {name} | {fam} | {k} | {_split(v)} | "
                      f"{v['compute'] + v['even_stall']:.3f} | "
                      f"{best / v['total']:.3f} | {r['once']['total'] / v['total']:.3f} | "
                      f"{v['moves']} |")
    print("\n### Replay, extra rows: the same planner fed a forecast (not the headline policy)\n")
    print("| case | trace | ours@10+forecast | free fresh@10+forecast (bound) | "
          "best EPLB / ours+fc | once / ours+fc | forecasters picked (of re-plans) |")
    print("|---|---|---|---|---|---|---|")
    for (name, fam), r in replay_rows:
        v = r["ours@10+fc"]
        best = _best_eplb(r)
        picked = ", ".join(f"{k} x{n}" for k, n in sorted(v["picked"].items()))
        print(f"| {name} | {fam} | {_split(v)} | "
              f"{r['free@10+fc']['total']:.3f} | {best / v['total']:.3f} | "
              f"{r['once']['total'] / v['total']:.3f} | {picked} |")


if __name__ == "__main__":
    sys.exit(main())
