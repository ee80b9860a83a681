"""``moeplane agent``: the node agent (device telemetry, per-step expert loads, plan fan-out)."""

from __future__ import annotations

import argparse
import os


def parse_ranks(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``; empty -> ``[]``."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--ranks: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"--ranks: bad range {part!r}")
        out.extend(range(first, last + 1))
    return sorted(set(out))


def follow_arg(text: str) -> tuple[str, str]:
    """``verl=PATH`` / ``areal=DIR`` -> (kind, path)."""
    from moeplane.agents.follow.tail import parse_follow

    try:
        kind, path = parse_follow(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return kind, str(path)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "agent", help="run the node agent",
        description="Stream device telemetry, the node's per-step expert loads and its ranks' "
                    "memory profiles to the control plane; fan placement plans and offload "
                    "decisions out to the node's training ranks.")
    p.add_argument("--node-id", required=True, help="this node's id, e.g. node-0")
    p.add_argument("--server", default=os.environ.get("MOEPLANE_AGENT_SERVER",
                                                      "127.0.0.1:50051"),
                   help="control-plane ingest HOST:PORT (default %(default)s)")
    p.add_argument("--token", default=os.environ.get("MOEPLANE_AGENT_TOKEN", ""),
                   help="per-node token, sent as 'authorization: Bearer' "
                        "(default $MOEPLANE_AGENT_TOKEN)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--tls-ca", default="", help="CA bundle for --tls (default: system roots)")
    p.add_argument("--collector", default="sim", choices=("auto", "sim", "host", "nvml", "ascend"),
                   help="device source; auto detects NVML, then npu-smi, else host "
                        "(default %(default)s)")
    p.add_argument("--devices", type=int, default=8, help="devices for --collector sim")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the sim collector and backoff jitter (default: from node id)")
    p.add_argument("--job-id", default="", help="training job this node serves")
    p.add_argument("--ranks", type=parse_ranks, default=[],
                   help="global ranks of the job on this node, e.g. 0-7")
    p.add_argument("--local-socket", default="",
                   help="Unix socket for training ranks "
                        "(default /tmp/moeplane-agent-<node-id>.sock)")
    p.add_argument("--spool-dir", default="",
                   help="spool directory (default ~/.local/state/moeplane/agent-<node-id>)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="sampling interval in seconds until the control plane sets one")
    p.add_argument("--step-deadline", type=float, default=10.0,
                   help="seconds after a step's first rank report before it is sent "
                        "without the missing ranks")
    p.add_argument("--memory-interval", type=float, default=10.0,
                   help="at most one memory-profile message per this many seconds "
                        "(default %(default)s)")
    p.add_argument("--spool-max-mb", type=float, default=256.0, help="spool size bound")
    p.add_argument("--follow", type=follow_arg, action="append", default=[], metavar="KIND=PATH",
                   help="follow an RL framework's log and send its phases as spans (needs "
                        "--job-id): verl=FILE (verl's file logger, VERL_FILE_LOGGER_PATH) or "
                        "areal=DIR (AReaL's perf tracer, traces-r*.jsonl); repeatable")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    import zlib
    from pathlib import Path

    from moeplane.agents.collectors import make_collector
    from moeplane.agents.runtime import Agent, AgentOptions
    from moeplane.agents.uplink import UplinkOptions

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    seed = args.seed if args.seed is not None else zlib.crc32(args.node_id.encode())
    spool_dir = args.spool_dir or str(
        Path.home() / ".local" / "state" / "moeplane" / f"agent-{args.node_id}")
    if args.follow and not args.job_id:
        raise SystemExit("moeplane agent: --follow needs --job-id (the job the followed logs belong to)")
    options = AgentOptions(
        node_id=args.node_id, spool_dir=spool_dir, interval_s=args.interval,
        job_id=args.job_id, ranks=args.ranks, local_socket=args.local_socket,
        step_deadline_s=args.step_deadline, memory_interval_s=args.memory_interval,
        max_spool_bytes=int(args.spool_max_mb * (1 << 20)), follow=args.follow,
        uplink=UplinkOptions(server=args.server, token=args.token, tls=args.tls,
                             tls_ca_file=args.tls_ca, seed=seed),
    )
    collector = make_collector(args.collector, args.node_id, devices=args.devices, seed=seed)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Agent(options, collector).run(stop)

    asyncio.run(main())
    return 0
