"""``moeplane loadgen``: emulate many node agents from few processes against a control plane.

N nodes × ranks each report L × E expert counts per step (per rank or per node), step
statistics, and device samples every interval; prints what was acknowledged and how fast.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("loadgen", help="emulate many agents (load generator)", description=__doc__)
    p.add_argument("--target", action="append", dest="targets",
                   help="control-plane gRPC host:port (repeat for replicas; default 127.0.0.1:50051)")
    p.add_argument("--job", default="loadgen", help="job id (default loadgen)")
    p.add_argument("--nodes", type=int, default=4, help="emulated node agents N (default 4)")
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks (and devices) per node (default 8)")
    p.add_argument("--layers", type=int, default=58, help="MoE layers L (default 58)")
    p.add_argument("--experts", type=int, default=256, help="experts per layer E (default 256)")
    p.add_argument("--per-node", action="store_true",
                   help="one ExpertLoads per node per step (default: one per rank, no node aggregation)")
    p.add_argument("--step-time", type=float, default=10.0, help="seconds per step; 0: no loads (default 10)")
    p.add_argument("--sample-interval", type=float, default=1.0,
                   help="seconds between device-sample rounds; 0: none (default 1)")
    p.add_argument("--metrics", type=int, default=16, help="metrics per device (default 16)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds to run (default 30)")
    p.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--streams-per-channel", type=int, default=1,
                   help="agents sharing one connection (default 1: a connection each)")
    p.add_argument("--max-in-flight", type=int, default=64, help="unacked messages per stream (default 64)")
    p.add_argument("--dtype", choices=("int32", "int64"), default="int32", help="wire dtype of counts")
    p.add_argument("--no-apply-plans", action="store_false", dest="apply_plans",
                   help="do not report received plans as applied")
    p.add_argument("--node-prefix", default="lg", help="node ids are PREFIX-00000 ... (default lg)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the full merged observations as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import json
    import sys

    from moeplane.controlplane.loadgen.config import LoadgenConfig
    from moeplane.controlplane.loadgen.runner import run
    from moeplane.controlplane.loadgen.stats import summary

    try:
        cfg = LoadgenConfig(
            targets=tuple(args.targets or ("127.0.0.1:50051",)), job_id=args.job, nodes=args.nodes,
            ranks_per_node=args.ranks_per_node, layers=args.layers, experts=args.experts,
            per_rank=not args.per_node, step_time_s=args.step_time, sample_interval_s=args.sample_interval,
            metrics=args.metrics, duration_s=args.duration, max_in_flight=args.max_in_flight,
            dtype=args.dtype, apply_plans=args.apply_plans, seed=args.seed, node_prefix=args.node_prefix,
        )
        merged = run(cfg, args.processes, streams_per_channel=args.streams_per_channel)
    except ValueError as exc:
        print(f"moeplane loadgen: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(merged, fh)
    print(json.dumps(summary(merged), indent=2))
    return 0 if not merged["errors"] and not merged["stream_errors"] else 1
