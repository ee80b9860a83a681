"""Memory-offload decisions on synthetic profiles versus the everything baselines.

    .venv/bin/python benchmarks/memory.py

For dense and MoE stacks of several sizes, host links and watermarks: the engine's decision
must meet the high watermark (or say CANNOT_MEET), and its predicted overhead must be no worse
than recompute-everything or swap-everything (every layer swapped, every optimizer state
offloaded) wherever that baseline fits (peak under the watermark, host memory within the
node's). Prints a markdown table and exits non-zero on a violation.
"""

from __future__ import annotations

import sys
import time

from moeplane.controlplane.memory import NodeMemory, Verdict, WatermarkPolicy, decide_offload
from moeplane.controlplane.memory.model import build_profile, plan_from_applied
from moeplane.controlplane.memory.search import recompute_everything, swap_everything
from moeplane.controlplane.memory.synthetic import StackShape, device_for, layer_profiles

GB = 10**9
SHAPES = (
    StackShape("dense-7B", hidden=4096, seq=4096, micro_batch=1, layers=32, ffn=11008,
               zero_shards=8),
    StackShape("dense-13B/2pp", hidden=5120, seq=4096, micro_batch=2, layers=20, ffn=13824,
               zero_shards=8),
    StackShape("moe-16B", hidden=2048, seq=4096, micro_batch=2, layers=28, ffn=10944,
               moe_every=1, experts_per_device=8, expert_ffn=1408, top_k=6, zero_shards=8),
    StackShape("moe-671B/16pp", hidden=7168, seq=4096, micro_batch=1, layers=4, ffn=18432,
               moe_every=1, experts_per_device=8, expert_ffn=2048, top_k=8, zero_shards=32),
)
BANDWIDTHS = (25 * GB, 55 * GB)
WATERMARKS = (0.9, 0.8, 0.7, 0.6)
FILL = 0.97  # the stack uses 97 % of the device with no action
HOST = {"ample": 2000 * GB, "scarce": 8 * GB}


def main() -> int:
    rows, violations = [], []
    for shape in SHAPES:
        layers = layer_profiles(shape)
        demand = sum(x.parameter_bytes + x.gradient_bytes + x.optimizer_bytes
                     + x.activation_bytes for x in layers)
        capacity = int(demand / FILL)
        for bw in BANDWIDTHS:
            for host_name, host in HOST.items():
                for high in WATERMARKS:
                    dev = device_for(shape, capacity, bw, "n0", "d0")
                    policy = WatermarkPolicy(high, high - 0.2)
                    start = time.perf_counter()
                    [d] = decide_offload([dev], [NodeMemory("n0", host)], policy)
                    took = time.perf_counter() - start
                    profile = build_profile(dev, max(0, dev.used_bytes - plan_from_applied(
                        build_profile(dev, 0), ()).peak()))
                    base = {}
                    for name, plan in (("recompute-all", recompute_everything(profile)),
                                       ("swap-all", swap_everything(profile))):
                        fits = plan.peak() <= d.high_watermark_bytes and plan.host <= host
                        base[name] = (plan.overhead(), fits)
                    if d.verdict is Verdict.CANNOT_MEET:
                        if any(fits for _, fits in base.values()):
                            violations.append(f"{shape.name}: CANNOT_MEET but a baseline fits")
                    else:
                        if d.peak_after_bytes > d.high_watermark_bytes:
                            violations.append(f"{shape.name}: over the watermark")
                        for name, (cost, fits) in base.items():
                            if fits and d.overhead_s > cost + 1e-12:
                                violations.append(f"{shape.name}: worse than {name}")
                    rows.append((shape.name, bw, host_name, high, d, base, capacity, took))
    print("| profile | link GB/s | host | high | verdict | peak after / cap | overhead ms "
          "| recompute-all ms | swap-all ms | vs best fitting baseline | actions | decide ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, bw, host_name, high, d, base, capacity, took in rows:
        fitting = [c for c, fits in base.values() if fits]
        ratio = "-" if not fitting or d.verdict is Verdict.CANNOT_MEET else (
            "0 / 0" if min(fitting) == 0 else f"{d.overhead_s / min(fitting):.3f}")

        def cell(entry):
            cost, fits = entry
            return f"{cost * 1e3:.1f}" + ("" if fits else " (does not fit)")

        acts = ", ".join(f"{a.kind.value}:{len(a.layers)}" for a in d.actions) or "-"
        print(f"| {name} | {bw / GB:.0f} | {host_name} | {high:.1f} | {d.verdict.value} | "
              f"{d.peak_after_bytes / capacity:.3f} | {d.overhead_s * 1e3:.2f} | "
              f"{cell(base['recompute-all'])} | {cell(base['swap-all'])} | {ratio} | {acts} | "
              f"{took * 1e3:.0f} |")
    met = sum(1 for r in rows if r[4].verdict is not Verdict.CANNOT_MEET)
    print(f"\n{len(rows)} cases: {met} meet the high watermark, {len(rows) - met} CANNOT_MEET; "
          f"{len(violations)} violations")
    for v in violations:
        print("VIOLATION", v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
