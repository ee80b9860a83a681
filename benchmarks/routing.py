"""Per-step replica routing: quality against the LP optimum and cost per layer.

    .venv/bin/python -m benchmarks.routing [--steps 2] [--seed 0]

Cases, 58 layers x 256 experts, top-8: 64 GPUs x 5 slots (the speed target's shape) and
32 GPUs x 9 slots (the issue's), each on the drifting trace (``harness.traces.drifting_trace``,
4,096 tokens per rank per step) and on the simulator's workload (``workload_trace``). The
placement is ``plan_placement`` (fresh) of the mean of steps [0, 20); the routed steps are the
last ``--steps`` of steps [20, 40), drift included.

Quality, per (layer, step): the most loaded GPU's tokens under ``route_replicas`` and under the
even split (today's rule), against the LP optimum with the replicas fixed
(``harness.routing_lp.lp_optimum``, exact max-flow bisection), as ratios; "expert time" is the sum over
layers and steps of the most loaded GPU's tokens, routed against even.

Cost per layer, all measured in this run, CPU time of this process (``time.process_time``; the
machine is shared, wall time is also given): ``route_replicas`` on all 58 layers / 58, called
step after step with one plan's placement (its table cached: the digest of the placement is
the per-call overhead); the same with a new placement in every call (``routing_table`` +
``route_with``: the table built, what the first step after a plan pays); ``route_with`` with
the table passed in; the even split (``gpu_loads``, the baseline); the SDK's torch version
(``DeviceRouting.quotas``, one layer, on the CPU).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from harness.routing_lp import lp_optimum
from harness.traces import drifting_trace, workload_trace
from moeplane.agents.sdk.routing import DeviceRouting
from moeplane.controlplane.balancing import gpu_loads, plan_placement
from moeplane.controlplane.balancing.routing import route_replicas, route_with, routing_table

LAYERS, EXPERTS, TOP_K, TOKENS_PER_RANK = 58, 256, 8, 4096
CASES = ((64, 5), (32, 9))


def trace_of(family: str, gpus: int, seed: int) -> np.ndarray:
    if family == "walk":
        t = drifting_trace(40, LAYERS, EXPERTS, tokens_per_layer=gpus * TOKENS_PER_RANK * TOP_K,
                           seed=seed)
    else:
        t = workload_trace(40, LAYERS, EXPERTS, gpus=gpus, top_k=TOP_K, seed=seed)
    return np.rint(t).astype(np.int64)


def timed(fn, reps: int) -> tuple[float, float]:
    """(CPU s, wall s) per call, best of three rounds of ``reps`` calls."""
    fn()
    best = (float("inf"), float("inf"))
    for _ in range(3):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(reps):
            fn()
        c, w = (time.process_time() - c0) / reps, (time.perf_counter() - w0) / reps
        best = min(best, (c, w))
    return best


def quality(trace, p, gpus, steps):
    rows = []
    for t in range(40 - steps, 40):
        routed = route_replicas(trace[t], p, gpus=gpus).reshape(LAYERS, gpus, -1).sum(2).max(1)
        even = gpu_loads(trace[t], p, gpus).max(axis=1)
        opt = np.array([lp_optimum(trace[t, lay], p[lay], gpus) for lay in range(LAYERS)])
        rows.append((routed, even, opt))
    routed, even, opt = (np.concatenate(x) for x in zip(*rows, strict=True))
    return routed / opt, even / opt, routed.sum() / even.sum()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| case | trace | routed / LP: mean, max | even / LP: mean, max | expert time routed / "
          "even |")
    print("|---|---|---|---|---|")
    timing = []
    for gpus, spg in CASES:
        for family in ("walk", "sim"):
            trace = trace_of(family, gpus, args.seed)
            p = plan_placement(trace[:20].mean(axis=0), gpus=gpus, slots_per_gpu=spg).phy2log
            r, e, gain = quality(trace, p, gpus, args.steps)
            print(f"| {gpus}x{spg} | {family} | {r.mean():.4f}, {r.max():.4f} | "
                  f"{e.mean():.4f}, {e.max():.4f} | {gain:.4f} |")
            if family == "walk":
                timing.append((gpus, spg, trace[39], p))
    print()
    print("| case | route_replicas, same placement | table built (new placement) | "
          "route_with (table passed) | even split (baseline) | torch quotas, 1 layer |")
    print("|---|---|---|---|---|---|")
    for gpus, spg, step, p in timing:
        table = routing_table(p, gpus=gpus, num_experts=EXPERTS)
        full = timed(lambda step=step, p=p, gpus=gpus: route_replicas(step, p, gpus=gpus), 10)
        built = timed(lambda step=step, p=p, gpus=gpus: route_with(
            routing_table(p, gpus=gpus, num_experts=EXPERTS), step), 10)
        cached = timed(lambda step=step, table=table: route_with(table, step), 10)
        even = timed(lambda step=step, p=p, gpus=gpus: gpu_loads(step, p, gpus), 50)
        dev = DeviceRouting(p[0], gpus=gpus, num_experts=EXPERTS, ranks_per_node=8)
        counts = torch.as_tensor(step[0])
        one = timed(lambda dev=dev, counts=counts: dev.quotas(counts), 20)

        def cell(v, per_layer=True):
            k = 1e3 / (LAYERS if per_layer else 1)
            return f"{v[0] * k:.3f} ({v[1] * k:.3f})"

        print(f"| {gpus}x{spg} | {cell(full)} | {cell(built)} | {cell(cached)} | {cell(even)} | "
              f"{cell(one, per_layer=False)} |")


if __name__ == "__main__":
    main()
