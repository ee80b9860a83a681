"""``moeplane demo``: the main job on the embedded default, in one command.

Starts a control plane (SQLite file + in-process bus), one node agent per simulated node, and a
simulated MoE training job that reports through those agents and applies the plans and memory
offload decisions the control plane pushes. With torch installed it also trains a small MoE
model for real (``examples/train_moe.py``, 4 gloo ranks on CPU) through its own agent, as a
second job. Prints the URLs, what each dashboard page shows and REST calls to try; Ctrl-C (or
SIGTERM) stops every process it started.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("demo", help="run control plane + agents + a simulated job", description=__doc__)
    p.add_argument("--data-dir", default=".moeplane-demo", help="where the SQLite file, spools and logs go")
    p.add_argument("--http-port", type=int, default=8080)
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--experts", type=int, default=48, help="logical experts per layer (48 on 32 ranks leaves 16 redundant slots)")
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--step-time", type=float, default=1.0, help="seconds per simulated training step")
    p.add_argument("--steps", type=int, default=0, help="steps to run (0: until stopped)")
    p.add_argument("--pressure-every", type=int, default=90,
                   help="steps between longer-sequence phases that put 3 ranks under memory "
                        "pressure (0: none)")
    p.add_argument("--host-spell-every", type=int, default=120,
                   help="steps between host-bound spells, a slow data loader on one node (0: none)")
    p.add_argument("--train", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the real training job examples/train_moe.py (needs torch)")
    p.add_argument("--train-steps-per-s", type=float, default=1.0,
                   help="pace of the real training job (it pauses between steps)")
    p.add_argument("--train-capacity-mb", type=float, default=29.0,
                   help="device memory each CPU rank of the real job reports (it uses about "
                        "17-25 MB), for its offload decisions")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the previous run's database and spools (default: start fresh)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from moeplane.controlplane.demo import Demo

    return Demo(args).run()
