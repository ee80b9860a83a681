"""``moeplane replay``: what would the controller have done on this trace (or this job)?

    moeplane replay (--trace TRACE.npy | --job JOB [--database-url URL])
                    [--gpus G --slots-per-gpu S] [--nodes N] [--groups K] [--expert-bytes B]
                    [--bandwidth INTRA,CROSS] [--warmup W] [--report R.json]

TRACE.npy: ``[steps, layers, experts]`` tokens (integer or float, >= 0); ``--job`` reads the
job's stored per-step loads instead, and takes the job's G, S, nodes and groups as the
controller sees them for defaults (``--gpus`` and ``--slots-per-gpu`` are required with
``--trace``). Runs the controller's own decision code step by step with the replayed job's
clock (``moeplane.controlplane.controller.replay``) beside EPLB re-planned every 10 and every
50 steps, EPLB's plan tuned once, and the per-step oracle, all in the same run; prints one line
per policy and writes the report (time per step, stall, plans, moves, expert time of every
step, speed-ups). ``--bandwidth``: bytes/s per rank within a node and across nodes.
``--groups K``: experts ``g*E/K .. (g+1)*E/K-1`` form group g and every replica of a group
stays on one node (EPLB is then its hierarchical policy). Bad input: exit status 2 and one
line on stderr naming what is wrong.
"""

from __future__ import annotations

import argparse
import sys

from moeplane.controlplane.cli.serve import add_store_args

EXIT_BAD_INPUT = 2


class _BadInput(Exception):
    """Input the replay cannot use; the message is the one line printed."""


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="replay the controller's policy on a load trace",
                              description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="TRACE.npy, [steps, layers, experts] tokens")
    src.add_argument("--job", help="a stored job: replay its recorded loads")
    p.add_argument("--gpus", type=int,
                   help="expert-parallel GPUs G (required with --trace; default: the job's)")
    p.add_argument("--slots-per-gpu", type=int,
                   help="expert slots S per GPU (required with --trace; default: the job's)")
    p.add_argument("--nodes", type=int,
                   help="nodes the GPUs span (default 1, or the job's)")
    p.add_argument("--groups", type=int,
                   help="expert groups K, each kept on one node (default: none, or the job's)")
    p.add_argument("--expert-bytes", type=int, help="bytes per expert copy (default: policy's)")
    p.add_argument("--bandwidth", help="INTRA,CROSS bytes/s per rank (default: policy's)")
    p.add_argument("--warmup", type=int, default=20, help="steps before the replay (default 20)")
    p.add_argument("--report", help="R.json to write")
    add_store_args(p)

    def one_line_error(message: str) -> None:
        print(f"moeplane replay: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)

    p.error = one_line_error  # type: ignore[method-assign]
    p.set_defaults(func=run)


def _trace_file(path: str):
    import numpy as np

    from moeplane.controlplane.cli.plan import _BadInput as PlanBadInput
    from moeplane.controlplane.cli.plan import _load_npy

    try:
        return np.asarray(_load_npy(path, "--trace"))
    except PlanBadInput as exc:
        raise _BadInput(str(exc)) from None


def job_trace(database_url: str, job: str):
    """``(loads [steps, L, E] int64, shape)`` of a stored job: every stored step's global
    loads, oldest first, and ``shape`` {"gpus", "slots_per_gpu", "nodes", "groups"} of the
    job as the controller sees it (``store.placements.geometry``; groups None: none).
    ``_BadInput`` for an unknown job or one without loads."""
    import numpy as np

    from moeplane.controlplane.store import queries as q
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.placements import geometry

    engine = make_engine(database_url)
    rows, step = [], 0
    try:
        row = q.get_job(engine, job)
        while True:
            page = q.loads_history(engine, job, q.Range(step_start=step, limit=q.MAX_LIMIT))
            rows += page
            if len(page) < q.MAX_LIMIT:
                break
            step = page[-1]["step"] + 1
        if not rows:
            raise _BadInput(f"--job: job {job!r} has no stored loads")
        trace = np.stack([r["counts"] for r in rows]).astype(np.int64)
        geo = geometry(engine, row, shape=trace.shape[1:])
    except q.NotFound:
        raise _BadInput(f"--job: no job {job!r} in the database") from None
    finally:
        engine.dispose()
    return trace, {"gpus": geo.ranks, "slots_per_gpu": geo.slots_per_rank, "nodes": geo.nodes,
                   "groups": row.get("groups")}


def _job_trace(args):
    from moeplane.controlplane.cli.serve import settings_from

    return job_trace(settings_from(args).database_url, args.job)


def check_groups(groups, experts: int, gpus: int, slots_per_gpu: int, nodes: int):
    """``groups`` (None or K >= 1) that fit the trace and the GPUs, or ``_BadInput``."""
    from moeplane.controlplane.balancing.groups import check_groups as fits

    if groups is None:
        return None
    if groups < 1:
        raise _BadInput(f"--groups: must be >= 1, got {groups}")
    try:
        fits(groups, experts, gpus, slots_per_gpu, nodes)
    except ValueError as exc:
        raise _BadInput(f"--groups: {exc}") from None
    return groups


def check_trace(trace, gpus: int, slots_per_gpu: int, nodes: int, warmup: int):
    """The trace as float64 ``[T, L, E]``, or ``_BadInput`` naming what is wrong."""
    import numpy as np

    if trace.dtype == np.bool_ or trace.dtype.kind not in "iuf":
        raise _BadInput(f"--trace: expected integer or float tokens, got dtype {trace.dtype}")
    if trace.ndim != 3:
        raise _BadInput(f"--trace: expected [steps, layers, experts], got {trace.ndim} "
                        f"dimensions {trace.shape}")
    out = trace.astype(np.float64)
    if not np.isfinite(out).all():
        raise _BadInput("--trace: loads must be finite (found NaN or infinity)")
    if (out < 0).any():
        raise _BadInput("--trace: loads must be non-negative")
    for name, value in (("--gpus", gpus), ("--slots-per-gpu", slots_per_gpu),
                        ("--nodes", nodes), ("--warmup", warmup)):
        if value < 1:
            raise _BadInput(f"{name}: must be >= 1, got {value}")
    if gpus % nodes:
        raise _BadInput(f"--nodes: {nodes} does not divide --gpus {gpus}")
    if gpus * slots_per_gpu < out.shape[2]:
        raise _BadInput(f"--gpus * --slots-per-gpu = {gpus * slots_per_gpu} is fewer than the "
                        f"{out.shape[2]} experts of the trace")
    if out.shape[0] <= warmup:
        raise _BadInput(f"--trace: {out.shape[0]} steps, need more than --warmup {warmup}")
    return out


def _policy(args):
    from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy

    over = {}
    if args.expert_bytes is not None:
        over["expert_bytes"] = args.expert_bytes
    if args.bandwidth is not None:
        parts = args.bandwidth.split(",")
        try:
            intra, cross = (float(x) for x in parts)
        except ValueError:
            raise _BadInput(f"--bandwidth: expected INTRA,CROSS bytes/s, got {args.bandwidth!r}")\
                from None
        over |= {"intra_node_bytes_per_s": intra, "cross_node_bytes_per_s": cross}
    try:
        return RebalancePolicy(**over)
    except ValueError as exc:
        raise _BadInput(f"--expert-bytes/--bandwidth: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import json

    from moeplane.controlplane.controller.replay import replay_trace

    try:
        raw, job = (_trace_file(args.trace), {"nodes": 1}) if args.trace else _job_trace(args)
        given = {"gpus": args.gpus, "slots_per_gpu": args.slots_per_gpu, "nodes": args.nodes,
                 "groups": args.groups}
        shape = job | {k: v for k, v in given.items() if v is not None}
        for name in ("gpus", "slots_per_gpu"):
            if name not in shape:
                raise _BadInput(f"--{name.replace('_', '-')}: required with --trace")
        gpus, spg, nodes = shape["gpus"], shape["slots_per_gpu"], shape["nodes"]
        trace = check_trace(raw, gpus, spg, nodes, args.warmup)
        groups = check_groups(shape.get("groups"), trace.shape[2], gpus, spg, nodes)
        policy = _policy(args)
    except _BadInput as exc:
        print(f"moeplane replay: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = replay_trace(trace, gpus=gpus, slots_per_gpu=spg, nodes=nodes, policy=policy,
                          warmup=args.warmup, groups=groups)
    print(f"replayed {report['steps']} steps on {gpus} GPUs x {spg} slots, {nodes} node(s)"
          + (f", {groups} groups" if groups else ""))
    for name, r in report["policies"].items():
        print(f"{name:>10}: {r['total_s_per_step']:.4f} s/step (expert {r['expert_s_per_step']:.4f}"
              f", stall {r['stall_s_per_step']:.4f}), {r['plans']} plans, {r['moves']} moves")
    s = report["speedup"]
    print(f"controller: {s['vs_best_eplb']:.3f}x the better EPLB cadence, "
          f"{s['vs_once']:.3f}x EPLB tuned once")
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")
    return 0
