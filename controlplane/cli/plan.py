"""``moeplane plan``: plan expert placement from a load matrix (a stable contract).

    moeplane plan --loads LOADS.npy --gpus G --slots-per-gpu S [--nodes N]
                  [--current CURRENT.npy] [--max-moves K] [--search repair|relieve]
                  [--groups K]
                  --out PLAN.npy [--report REPORT.json]

LOADS.npy: float or integer ``[L, E]``; CURRENT.npy and PLAN.npy: int64 ``[L, G*S]``.
REPORT.json: ``balancedness_before`` (of CURRENT, or of the identity placement ``slot % E``),
``balancedness_after``, ``moved``, ``cross_node_moved``, ``slot_changes`` (copies within a
GPU: a staying expert keeps its slot, so only extra replicas of an expert the GPU holds),
``elapsed_ms``, and the shape and settings used. Unreadable or inconsistent input: exit status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys

EXIT_BAD_INPUT = 2


class _BadInput(Exception):
    """Input the planner cannot use; the message is the one line printed."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan expert placement (EPLB-compatible phy2log) from per-expert loads",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--loads", required=True, help="LOADS.npy, float or int [L, E]")
    parser.add_argument("--gpus", required=True, type=int, help="expert-parallel GPUs G")
    parser.add_argument("--slots-per-gpu", required=True, type=int, help="expert slots S per GPU")
    parser.add_argument("--nodes", type=int, default=1, help="nodes the GPUs span (default 1)")
    parser.add_argument("--current", help="CURRENT.npy, int64 [L, G*S]: plan incrementally")
    parser.add_argument("--max-moves", type=int, help="most expert copies to move (needs --current)")
    parser.add_argument("--search", choices=("repair", "relieve"), default="repair",
                        help="incremental search without --max-moves: repair (default) or "
                             "relieve (the most loaded GPUs first: more moves for the same balance)")
    parser.add_argument("--groups", type=int,
                        help="K expert groups (experts g*E/K..(g+1)*E/K-1), each kept on one "
                             "node, as DeepSeek-V3's node-limited routing needs")
    parser.add_argument("--out", required=True, help="PLAN.npy to write, int64 [L, G*S]")
    parser.add_argument("--report", help="REPORT.json to write")

    def one_line_error(message: str) -> None:  # argparse's usage block would be several lines
        print(f"moeplane plan: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)

    parser.error = one_line_error  # type: ignore[method-assign]
    parser.set_defaults(func=run)


def _load_npy(path: str, what: str):
    import numpy as np

    prefix = np.lib.format.MAGIC_PREFIX
    try:
        with open(path, "rb") as fh:
            # checked first: numpy reports a file without it (text, .npz) as "pickled data"
            if fh.read(len(prefix)) != prefix:
                raise _BadInput(f"{what}: {path} is not a .npy file (no .npy header)")
            fh.seek(0)
            return np.load(fh, allow_pickle=False)
    except FileNotFoundError:
        raise _BadInput(f"{what}: no such file: {path}") from None
    except (OSError, ValueError, EOFError) as exc:
        raise _BadInput(f"{what}: cannot read {path} as .npy: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import time

    import numpy as np

    from moeplane.controlplane.balancing import plan_placement
    from moeplane.controlplane.balancing.planner import runs_repair

    try:
        loads = _load_npy(args.loads, "--loads")
        current = _load_npy(args.current, "--current") if args.current else None
        if current is not None and current.dtype != np.int64:
            raise _BadInput(f"--current: expected int64, got {current.dtype}")
        if runs_repair(current is not None, args.max_moves, args.search):
            # load the compiled kernel (numba's cache; compiled the first time on a machine)
            # before the clock starts: like an import, it is not part of planning
            from moeplane.controlplane.balancing.repair import warm_up

            warm_up()
        start = time.perf_counter()
        try:
            plan = plan_placement(
                loads,
                gpus=args.gpus,
                slots_per_gpu=args.slots_per_gpu,
                nodes=args.nodes,
                current=current,
                max_moves=args.max_moves,
                search=args.search,
                groups=args.groups,
            )
        except ValueError as exc:
            raise _BadInput(_flag_names(str(exc))) from None
        elapsed_ms = (time.perf_counter() - start) * 1e3
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise _BadInput(f"--out: no such directory: {out_dir}")
        if args.report and not os.path.isdir(os.path.dirname(os.path.abspath(args.report))):
            raise _BadInput(f"--report: no such directory for {args.report}")
    except _BadInput as exc:
        print(f"moeplane plan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    with open(args.out, "wb") as fh:
        np.save(fh, plan.phy2log.astype(np.int64))
    num_layers, num_experts = plan.replica_counts.shape
    report = {
        "balancedness_before": plan.balancedness_before,
        "balancedness_after": plan.balancedness_after,
        "moved": plan.moves,
        "cross_node_moved": plan.cross_node_moves,
        "slot_changes": plan.slot_changes,
        "elapsed_ms": round(elapsed_ms, 3),
        "layers": num_layers,
        "experts": num_experts,
        "gpus": plan.gpus,
        "slots_per_gpu": plan.slots_per_gpu,
        "nodes": plan.nodes,
        "incremental": plan.incremental,
        "max_moves": args.max_moves,
        "search": args.search,
        "groups": args.groups,
        "before_placement": "current" if plan.incremental else "identity (slot % E)",
    }
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
    print(
        f"planned {num_layers}x{num_experts} on {plan.gpus}x{plan.slots_per_gpu} slots: "
        f"balancedness {plan.balancedness_before:.4f} -> {plan.balancedness_after:.4f}, "
        f"{plan.moves} moves ({plan.cross_node_moves} cross-node), "
        f"{plan.slot_changes} slot changes within a GPU, {elapsed_ms:.1f} ms"
    )
    return 0


_FLAGS = {
    "loads": "--loads",
    "current": "--current",
    "gpus": "--gpus",
    "slots_per_gpu": "--slots-per-gpu",
    "nodes": "--nodes",
    "max_moves": "--max-moves",
    "groups": "--groups",
}


def _flag_names(message: str) -> str:
    """Name the command-line flag for an argument named by the planner's error."""
    words = message.split(" ", 2)
    if words[0] in _FLAGS and (len(words) < 2 or words[1] != "*"):
        return f"{_FLAGS[words[0]]}: {message}"
    return message
