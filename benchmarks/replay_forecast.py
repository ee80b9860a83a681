"""Which forecast should feed the controller's planner? The controller's policy replayed
(``moeplane.controlplane.controller.replay.replay_trace``, default ``RebalancePolicy``) with
each candidate as its planner input, on the drifting traces and a real tiny-MoE run.

    .venv/bin/python -m benchmarks.replay_forecast [--train-trace T.npy]

Candidates, each a function of the controller's window (the last ``window_steps`` = 20 steps,
``[W, L, E]``): ``mean`` (the window's mean), ``ema 0.3`` (the runner's ``decide.ema``),
``ema 0.5``, ``holt`` (``holt_forecast``, alpha 0.2, beta 0.1), ``last 5`` (the mean of the
window's last 5 steps) and ``chosen`` (``choose_forecaster`` among ``FORECASTERS`` by
one-step-ahead error on the window itself, the planner benchmark's "+fc"). EPLB tuned once,
EPLB every 10 / 50 steps and the oracle do not use a forecast: they are the same in every row of
a case (printed once).

Cases: the planner benchmark's families (``harness.traces``, seed 0): "sim" (the simulator's
workload: drift fast early, slow later) and "walk" (random walk of popularity, 16,384 tokens
per rank, top-8), each 16 x 64 on 8 GPUs x 10 slots (200 steps) and 58 x 256 on 32 GPUs x 9
slots, 4 nodes (80 steps); and ``--train-trace``: the loads of a real run of
``examples/train_moe.py`` recorded by ``benchmarks.train_moe_trace`` (4 x 16 on 4 GPUs x 5
slots).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness.traces import drifting_trace, workload_trace
from moeplane.controlplane.balancing import (
    FORECASTERS,
    choose_forecaster,
    ema_forecast,
    forecast,
    holt_forecast,
)
from moeplane.controlplane.controller.decide import ema
from moeplane.controlplane.controller.replay import replay_trace

TOKENS_PER_RANK, TOP_K = 16384, 8


def chosen(window: np.ndarray) -> np.ndarray:
    method, params = FORECASTERS[choose_forecaster(window, warmup=min(10, len(window) - 1))]
    return forecast(window, method=method, **params)


CANDIDATES = {
    "mean": lambda w: w.mean(axis=0),
    "ema 0.3": ema,
    "ema 0.5": lambda w: ema_forecast(w, alpha=0.5),
    "holt": lambda w: holt_forecast(w),
    "last 5": lambda w: w[-5:].mean(axis=0),
    "chosen": chosen,
}


def cases(train_trace: str | None):
    for family in ("sim", "walk"):
        for layers, experts, gpus, spg, nodes, steps in ((16, 64, 8, 10, 1, 200),
                                                         (58, 256, 32, 9, 4, 80)):
            if family == "walk":
                trace = drifting_trace(steps, layers, experts,
                                       tokens_per_layer=gpus * TOKENS_PER_RANK * TOP_K, seed=0)
            else:
                trace = workload_trace(steps, layers, experts, gpus=gpus, top_k=TOP_K, seed=0)
            yield (f"{family} {layers}x{experts}, {gpus}x{spg} slots, {nodes} node(s), "
                   f"{steps} steps"), trace, dict(gpus=gpus, slots_per_gpu=spg, nodes=nodes)
    if train_trace:
        trace = np.load(train_trace)
        yield (f"train_moe.py {trace.shape[1]}x{trace.shape[2]}, 4x5 slots, "
               f"{trace.shape[0]} steps"), trace, dict(gpus=4, slots_per_gpu=5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-trace", help="[steps, L, E] loads of a real run (.npy)")
    args = ap.parse_args()
    print("| trace | forecast | controller s/step | plans | vs better EPLB | vs once |")
    print("|---|---|---|---|---|---|")
    for label, trace, geo in cases(args.train_trace):
        base = None
        for name, fn in CANDIDATES.items():
            t0 = time.process_time()
            r = replay_trace(trace, forecaster=fn, **geo)
            p, s = r["policies"], r["speedup"]
            base = base or {k: p[k]["total_s_per_step"] for k in ("once", "eplb@10", "eplb@50",
                                                                   "oracle")}
            print(f"| {label} | {name} | {p['controller']['total_s_per_step']:.5g} | "
                  f"{p['controller']['plans']} | {s['vs_best_eplb']:.3f}x | {s['vs_once']:.3f}x "
                  f"| ({time.process_time() - t0:.0f} s)", flush=True)
        print(f"| {label} | baselines | once {base['once']:.5g}, EPLB@10 {base['eplb@10']:.5g},"
              f" EPLB@50 {base['eplb@50']:.5g}, oracle {base['oracle']:.5g} | | | |", flush=True)


if __name__ == "__main__":
    main()
