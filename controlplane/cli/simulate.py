"""``moeplane simulate``: a simulated MoE training job reporting through the node agents."""

from __future__ import annotations

import argparse


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="run a simulated MoE training job",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="N nodes x G ranks of a simulated MoE job in one process. Each rank "
                    "reports its per-step expert loads, step statistics and memory profile to "
                    "the agent of its node (NodeLocal on a Unix socket) and applies placement "
                    "plans and memory-offload decisions. Longer-sequence phases put a few ranks "
                    "under memory pressure; host-bound spells slow one node's data loader.")
    p.add_argument("--job-id", required=True, help="id of the simulated job")
    p.add_argument("--nodes", type=_positive, default=2, help="nodes N (one agent each)")
    p.add_argument("--gpus-per-node", type=_positive, default=8, help="ranks per node G")
    p.add_argument("--layers", type=_positive, default=8, help="MoE layers L")
    p.add_argument("--experts", type=_positive, default=64, help="logical experts per layer E")
    p.add_argument("--top-k", type=_positive, default=8, help="experts per token")
    p.add_argument("--groups", type=int, default=0,
                   help="expert groups K, each kept on one node (0: none)")
    p.add_argument("--tokens-per-step", type=_positive, default=4096,
                   help="tokens each rank routes per step")
    p.add_argument("--step-time", type=float, default=1.0,
                   help="seconds per step at perfect balance (imbalance makes steps longer)")
    p.add_argument("--steps", type=int, default=0, help="steps to run; 0 runs until stopped")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--agent-socket-template", default="/tmp/moeplane-agent-{node}.sock",
                   help="socket of each node's agent; {node} is the node id, {i} its index")
    p.add_argument("--node-id-template", default="node-{i}",
                   help="node ids, {i} = 0..N-1")
    p.add_argument("--attach-timeout", type=float, default=60.0,
                   help="seconds to wait for every rank to reach its agent")
    m = p.add_argument_group("memory (each rank's device: 80 GiB)")
    m.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="send memory profiles and apply offload decisions")
    m.add_argument("--hidden", type=_positive, default=5120, help="model width")
    m.add_argument("--expert-ffn", type=_positive, default=2560, help="each expert's inner width")
    m.add_argument("--seq-len", type=_positive, default=4096, help="tokens per sample")
    m.add_argument("--micro-batch", type=_positive, default=1, help="samples per micro-batch")
    m.add_argument("--pressure-every", type=int, default=90,
                   help="steps between the starts of longer-sequence phases (0: none); each "
                        "lasts a third of that")
    m.add_argument("--pressure-ranks", type=_positive, default=3,
                   help="ranks in each longer-sequence phase")
    m.add_argument("--host-spell-every", type=int, default=120,
                   help="steps between the starts of host-bound spells (a slow data loader on "
                        "one node; 0: none); each lasts a quarter of that")
    r = p.add_argument_group("RL post-training (instead of the MoE pretraining job)")
    r.add_argument("--rl", choices=("colocated", "one-step-off", "async"), default=None,
                   help="simulate an RL job of this mode: its ranks send phase spans")
    r.add_argument("--staleness", type=int, default=1, help="staleness bound K for --rl async")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from moeplane.agents.sim.job import JobOptions, SimulatedJob
    from moeplane.agents.sim.memory import MemorySpec
    from moeplane.agents.sim.workload import Spells

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.rl:
        return _run_rl(args)
    if args.top_k > args.experts:
        raise SystemExit(f"--top-k ({args.top_k}) must be <= --experts ({args.experts})")
    if args.groups < 0:
        raise SystemExit("--groups must be >= 0")
    if args.step_time < 0 or args.steps < 0:
        raise SystemExit("--step-time and --steps must be >= 0")
    if args.pressure_every < 0 or args.host_spell_every < 0:
        raise SystemExit("--pressure-every and --host-spell-every must be >= 0")
    memory = MemorySpec(hidden=args.hidden, expert_ffn=args.expert_ffn, seq_len=args.seq_len,
                        micro_batch=args.micro_batch) if args.memory else None
    options = JobOptions(
        job_id=args.job_id, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        layers=args.layers, experts=args.experts, top_k=args.top_k, groups=args.groups,
        tokens_per_step=args.tokens_per_step, step_time_s=args.step_time, steps=args.steps,
        seed=args.seed, socket_template=args.agent_socket_template,
        node_template=args.node_id_template, attach_timeout_s=args.attach_timeout,
        memory=memory, pressure_ranks=args.pressure_ranks,
        pressure=Spells(args.pressure_every, max(1, args.pressure_every // 3),
                        first=min(15, args.pressure_every)),
        host_spells=Spells(args.host_spell_every, max(1, args.host_spell_every // 4),
                           first=min(30, args.host_spell_every)),
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await SimulatedJob(options).run(stop)

    try:
        asyncio.run(main())
    except TimeoutError as exc:
        logging.getLogger("moeplane.simulate").error("%s", exc)
        return 1
    return 0


def _run_rl(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from moeplane.agents.sim.rlrun import RLRunOptions, run_rl

    if args.staleness < 0 or args.steps < 1:
        raise SystemExit("--rl needs --steps >= 1 and --staleness >= 0")
    options = RLRunOptions(job_id=args.job_id, mode=args.rl, staleness=args.staleness, nodes=args.nodes,
                           gpus_per_node=args.gpus_per_node, steps=args.steps, step_time_s=args.step_time,
                           seed=args.seed, socket_template=args.agent_socket_template,
                           node_template=args.node_id_template, attach_timeout_s=args.attach_timeout)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_rl(options, stop)

    try:
        asyncio.run(main())
    except (TimeoutError, ValueError) as exc:
        logging.getLogger("moeplane.simulate").error("%s", exc)
        return 1
    return 0
