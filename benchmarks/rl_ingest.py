"""RL phase-span ingest: 1,024 ranks x 20 spans per 10 s step on <= 10 % of a core.

    .venv/bin/python -m benchmarks.rl_ingest --steps 12 --step-time 2 --out docs/bench-rl.md

A real ``moeplane serve`` (no dashboard, no controller) and a load generator in a separate
process (this module with ``--loadgen``): ``nodes`` gRPC streams (hello with the node's ranks),
then each step every node sends its ranks' spans (20 per rank: the 13 phases plus repeats,
in the SDK's packed columns) and waits for its acks. Time is compressed (``--step-time`` s per
step instead of 10 s): the work per step is the same, so CPU per step over 10 s is the share of a
core at the real rate. CPU is the serving process's user+system time (psutil) from the load
generator's start to its exit (hellos included); PostgreSQL server CPU is shown beside it.
Baseline in the same run: the serving process idling for half as long as the run (its own
background work: retention, rollups, the event loop), reported as ``idle share`` and subtracted
in ``net of idle``.

Two delivery shapes: per node (what the node agent sends: it merges its ranks' reports, see
``moeplane.agents.rlrelay``; 128 messages of 160 spans per step) and per rank (each rank's
report sent alone: 1,024 messages of 20 spans per step, for comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.scaleharness import (
    NO_CONTROLLER,
    cpu_of,
    pg_database,
    postgres_cpu,
    sqlite_database,
    start_serve,
)

SPANS_PER_RANK = 20
REAL_STEP_S = 10.0


# ------------------------------------------------------------------ load generator (own process)

def _report(job: str, ranks: list[int], step: int, t0: float):
    from moeplane.agents.rlreport import rl_report
    from moeplane.controlplane.rl.phases import PHASES, Spans

    n = len(ranks) * SPANS_PER_RANK
    rank = np.repeat(ranks, SPANS_PER_RANK)
    k = np.tile(np.arange(SPANS_PER_RANK), len(ranks))
    start = t0 + step * REAL_STEP_S + k * 0.4 + rank * 1e-3
    return rl_report(job, Spans.build(np.full(n, step), rank, np.full(n, step), k % len(PHASES),
                                      np.zeros(n, dtype=int), start, start + 0.3, np.full(n, 100)))


async def _node(port: int, node: int, ranks: list[int], a, ready: asyncio.Barrier, results: dict) -> None:
    import grpc

    from moeplane.controlplane.wire import moeplane_pb2 as pb
    from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc

    out: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (m := await out.get()) is not None:
            yield m

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = rpc.IngestStub(channel).Connect(requests())
        node_id = f"node-{node}"
        out.put_nowait(pb.AgentMessage(hello=pb.Hello(node_id=node_id, hostname=node_id, agent_version="bench",
                                                      job_id="rl-bench", ranks=ranks)))
        acks: dict[int, asyncio.Future] = {}
        bad = 0

        async def read():
            nonlocal bad
            async for msg in call:
                if msg.WhichOneof("body") == "ack":
                    bad += msg.ack.code != 0
                    fut = acks.pop(msg.ack.seq, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.ack.code)

        reader = asyncio.create_task(read())
        await ready.wait()
        seq, t_start = 0, time.monotonic()
        for step in range(a.steps):
            delay = t_start + step * a.step_time - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the step clock of the load generator
            groups = [ranks] if a.shape == "node" else [[r] for r in ranks]
            waits = []
            for g in groups:
                seq += 1
                acks[seq] = asyncio.get_running_loop().create_future()
                waits.append(acks[seq])
                out.put_nowait(pb.AgentMessage(seq=seq, rl=_report("rl-bench", g, step, 1e9)))
            await asyncio.wait_for(asyncio.gather(*waits), 120)
        results[node] = {"messages": seq, "bad_acks": bad}
        out.put_nowait(None)
        reader.cancel()


async def _loadgen(a) -> dict:
    ready = asyncio.Barrier(a.nodes)
    results: dict = {}
    await asyncio.gather(*(_node(a.port, i, list(range(i * a.ranks_per_node, (i + 1) * a.ranks_per_node)), a,
                                 ready, results) for i in range(a.nodes)))
    return {"messages": sum(r["messages"] for r in results.values()),
            "bad_acks": sum(r["bad_acks"] for r in results.values())}


# ------------------------------------------------------------------ driver

def run_case(url: str, shape: str, a, tmp: Path) -> dict:
    srv = start_serve(url, tmp, env=NO_CONTROLLER)
    try:
        pid = srv.popen.pid
        port = int(srv.grpc.rsplit(":", 1)[1])
        time.sleep(2.0)  # let the server settle before the idle baseline
        c0, t0 = cpu_of(pid), time.monotonic()
        time.sleep(a.steps * a.step_time / 2)  # idle baseline: the serving process doing nothing
        idle = (cpu_of(pid) - c0) / (time.monotonic() - t0)
        c0, pg0, t0 = cpu_of(pid), postgres_cpu(), time.monotonic()
        out = subprocess.run([sys.executable, "-m", "benchmarks.rl_ingest", "--loadgen", "--port", str(port),
                              "--shape", shape, "--nodes", str(a.nodes), "--ranks-per-node", str(a.ranks_per_node),
                              "--steps", str(a.steps), "--step-time", str(a.step_time)],
                             capture_output=True, text=True, timeout=600, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"load generator failed:\n{out.stderr[-3000:]}")
        wall = time.monotonic() - t0
        cpu, pg = cpu_of(pid) - c0, postgres_cpu() - pg0
        got = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        srv.stop()
    net = max(0.0, cpu - idle * wall)
    return {"db": url.split(":", 1)[0].split("+")[0], "shape": shape, "wall_s": wall, "cpu_s": cpu, "pg_s": pg,
            "idle_share": idle, "messages": got["messages"], "bad_acks": got["bad_acks"],
            "share_at_10s": cpu / (a.steps * REAL_STEP_S), "net_share_at_10s": net / (a.steps * REAL_STEP_S),
            "us_per_span": cpu / (a.steps * a.nodes * a.ranks_per_node * SPANS_PER_RANK) * 1e6}


def render(a, rows: list[dict], argv: list[str]) -> str:
    ranks = a.nodes * a.ranks_per_node
    lines = [
        "# Benchmark: RL phase-span ingest", "",
        f"Target: {ranks:,} ranks x {SPANS_PER_RANK} spans per 10 s step ingested on <= 10 % of a core.", "",
        f"Command: `.venv/bin/python -m benchmarks.rl_ingest {' '.join(argv)}`", "",
        f"Machine: {platform.node()} (shared 2-core development VM), Python {platform.python_version()}. "
        f"{a.nodes} nodes x {a.ranks_per_node} ranks, {a.steps} steps compressed to {a.step_time} s each "
        "(the same work per step; the share of a core is CPU per step over 10 s).", "",
        "Baseline (same run): the serving process idle for half the run (`idle`, its background work).", "",
        "| store | delivery | messages | bad acks | serve CPU s | share of a core at 10 s/step | net of idle | "
        "µs per span | PostgreSQL CPU s | idle share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['db']} | per {r['shape']} | {r['messages']:,} | {r['bad_acks']} | {r['cpu_s']:.2f} | "
                     f"**{100 * r['share_at_10s']:.1f} %** | {100 * r['net_share_at_10s']:.1f} % | "
                     f"{r['us_per_span']:.1f} | {r['pg_s']:.2f} | {100 * r['idle_share']:.2f} % |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=("node", "rank"), default="node", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--step-time", type=float, default=2.0, help="seconds per step (compressed from 10 s)")
    p.add_argument("--db", choices=("postgres", "sqlite", "both"), default="both")
    p.add_argument("--shapes", default="node,rank")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.loadgen:
        print(json.dumps(asyncio.run(_loadgen(a))))
        return 0
    rows = []
    import tempfile

    with tempfile.TemporaryDirectory(prefix="moeplane-rl-bench-") as tmp:
        dbs = ["postgres", "sqlite"] if a.db == "both" else [a.db]
        for db in dbs:
            for shape in a.shapes.split(","):
                with (pg_database() if db == "postgres" else sqlite_database()) as url:
                    rows.append(run_case(url, shape, a, Path(tmp)))
                    print(json.dumps(rows[-1]), flush=True)
    text = render(a, rows, sys.argv[1:] if argv is None else argv)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
