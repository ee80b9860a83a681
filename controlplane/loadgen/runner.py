"""Run emulated agents: many streams per process (asyncio), several processes per run.

SIGTERM ends a run early (to the whole process group when several processes run): agents
stop sending, drain their acknowledgements, and the observations are still reported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import signal
import time

import grpc

from moeplane.controlplane.loadgen import messages as m
from moeplane.controlplane.loadgen.agent import EmulatedAgent
from moeplane.controlplane.loadgen.config import LoadgenConfig
from moeplane.controlplane.loadgen.stats import Stats, merge

MAX_MESSAGE = 64 * 1024 * 1024
START_MARGIN_S = 1.0


async def run_async(cfg: LoadgenConfig, *, streams_per_channel: int = 1) -> dict:
    """Run ``cfg.nodes`` agents in this event loop; returns ``Stats.as_dict()``.

    ``streams_per_channel``: agents sharing one HTTP/2 connection (1 = a connection each,
    like real agents).
    """
    if streams_per_channel < 1:
        raise ValueError(f"streams_per_channel: must be >= 1, got {streams_per_channel}")
    stats = Stats()
    pool = m.count_pool(cfg)
    channels: dict[tuple[str, int], grpc.aio.Channel] = {}
    options = [("grpc.max_send_message_length", MAX_MESSAGE),
               ("grpc.max_receive_message_length", MAX_MESSAGE)]

    def channel_for(n: int):
        def get(target: str) -> grpc.aio.Channel:
            key = (target, n // streams_per_channel)
            if key not in channels:
                channels[key] = grpc.aio.insecure_channel(target, options=options)
            return channels[key]
        return get

    t0 = cfg.start_at if cfg.start_at is not None else time.time() + START_MARGIN_S
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread: no signals
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    agents = [
        EmulatedAgent(cfg, n, stats, pool, channel_for(n), t0=t0, stop=stop)
        for n in range(cfg.node_offset, cfg.node_offset + cfg.nodes)
    ]
    stats.started_at = t0
    try:
        await asyncio.gather(*(a.run() for a in agents))
    finally:
        stats.ended_at = time.time()  # after the drain: rates are over the time acks took
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        for ch in channels.values():
            await ch.close()
    return stats.as_dict()


def _in_process(cfg: LoadgenConfig, streams_per_channel: int) -> dict:
    return asyncio.run(run_async(cfg, streams_per_channel=streams_per_channel))


def split(cfg: LoadgenConfig, processes: int, start_at: float) -> list[LoadgenConfig]:
    """``cfg`` cut into ``processes`` contiguous node ranges of one job, all starting at ``start_at``."""
    if processes < 1:
        raise ValueError(f"processes: must be >= 1, got {processes}")
    processes = min(processes, cfg.nodes)
    base, extra = divmod(cfg.nodes, processes)
    parts, offset = [], cfg.node_offset
    for i in range(processes):
        count = base + (i < extra)
        parts.append(dataclasses.replace(cfg, node_offset=offset, nodes=count,
                                         world_nodes=cfg.total_nodes, start_at=start_at))
        offset += count
    return parts


def run(cfg: LoadgenConfig, processes: int = 1, *, streams_per_channel: int = 1) -> dict:
    """Run the whole job over ``processes`` worker processes; returns the merged stats."""
    if processes <= 1:
        return merge([_in_process(cfg, streams_per_channel)])
    start_at = cfg.start_at or time.time() + START_MARGIN_S + 0.5 * processes
    parts = split(cfg, processes, start_at)
    ctx = multiprocessing.get_context("spawn")
    # SIGTERM to the process group ends the run early: the workers stop and report, we wait
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with concurrent.futures.ProcessPoolExecutor(len(parts), mp_context=ctx) as pool:
        results = list(pool.map(_in_process, parts, [streams_per_channel] * len(parts)))
    return merge(results)
