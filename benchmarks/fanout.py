"""Plan fan-out: a plan committed (its ``pushed`` event) → every agent of the job has it.

    flock /tmp/moeplane-bench.lock .venv/bin/python -m benchmarks.fanout --agents 256 1024 --rounds 20

(``--out FILE`` writes the results table; docs/bench-fanout.md gives the text around it.)

Real ``moeplane serve`` on a fresh PostgreSQL database (in-process bus; with ``--replicas 2``
two serve processes share Redis and the agents are spread over them); the agents are
``moeplane loadgen`` streams (one node each, ``--ranks-per-node`` ranks) that rebuild every
plan's full placement with numpy (full or delta) and report it applied.

Two rows per agent count, in one session:

- incremental: two placements A and B are pushed through ``POST /jobs/{id}/plans`` (an
  operator's placement): A is the planner's incremental plan from the identity on skewed loads
  with a move budget of ``--moves`` of the slots, B the same from A on other skewed loads (when
  G*S == E no replica can move, so A and B are random in-layer swaps of that share of slots).
  Each round then rolls back to A or B in turn, so every round is a plan changing ~that share of
  slots against the previous one: it travels as a delta.
- full: a reshuffled placement R (the planner from scratch) is pushed, then rounds roll back to
  the identity (epoch 0) and to R in turn: every round changes almost every slot (a full plan).

Each round waits until the plan is applied by every node (polling the plan summaries, not the
[L, G*S] detail) and takes each agent's rebuild time minus the plan's ``pushed`` event time (one
clock: loopback). Reported per row: the time until the LAST agent had it (p50/p99 over rounds),
per agent (p50/p99), and the PlacementPlan bytes each agent received (median).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from benchmarks.scaleharness import (
    REDIS,
    cpu_of,
    free_port,
    loadgen,
    pg_database,
    postgres_cpu,
    read_json,
    start_serve,
)
from moeplane.controlplane.balancing import identity_placement, plan_placement
from moeplane.controlplane.loadgen.stats import percentiles
from moeplane.controlplane.procs import wait_until

JOB = "fanout"


def skewed_loads(layers: int, experts: int, seed: int) -> np.ndarray:
    """[L, E] Zipf-like tokens per expert (1/rank), a different hot set per layer and seed."""
    rng = np.random.default_rng(seed)
    base = 1e5 / np.arange(1, experts + 1)
    return np.stack([rng.permutation(base) * rng.uniform(0.8, 1.2, experts) for _ in range(layers)])


def swaps(current: np.ndarray, share: float, seed: int) -> np.ndarray:
    """``current [L, N]`` with ``share`` of each layer's slots exchanged in random pairs."""
    rng = np.random.default_rng(seed)
    out = current.copy()
    pairs = max(1, round(share * out.shape[1] / 2))
    for row in out:
        idx = rng.choice(out.shape[1], size=2 * pairs, replace=False)
        row[idx[:pairs]], row[idx[pairs:]] = row[idx[pairs:]].copy(), row[idx[:pairs]].copy()
    return out


def placements(layers: int, experts: int, world: int, slots: int, share: float):
    """(A, B, R): two incremental placements ~``share`` of slots apart, and a reshuffle [L, G*S]."""
    ident = identity_placement(layers, experts, world * slots)
    budget = round(share * layers * world * slots)
    a = plan_placement(skewed_loads(layers, experts, 1), gpus=world, slots_per_gpu=slots, nodes=world,
                       current=ident, max_moves=budget).phy2log
    b = plan_placement(skewed_loads(layers, experts, 2), gpus=world, slots_per_gpu=slots, nodes=world,
                       current=a, max_moves=budget).phy2log
    how = "planner"
    if (a == ident).all() or (a == b).all():  # G*S == E: nothing to replicate or move
        how = "random in-layer swaps"
        a = swaps(ident, share, 1)
        b = swaps(a, share, 2)
    r = plan_placement(skewed_loads(layers, experts, 3), gpus=world, slots_per_gpu=slots, nodes=world).phy2log
    return a, b, r, how


def one(agents: int, a, tmp: Path) -> list[dict]:
    world = agents * a.ranks_per_node
    slots = max(1, -(-a.experts // world))
    pa, pb, pr, how = placements(a.layers, a.experts, world, slots, a.moves)
    ident = identity_placement(a.layers, a.experts, world * slots)
    with pg_database() as url:
        servers = [start_serve(url, tmp, redis_url=REDIS if a.replicas > 1 else "", name=f"fanout-{agents}-{i}")
                   for i in range(a.replicas)]
        try:
            http = httpx.Client(base_url=servers[0].http + "/api/v1", timeout=120)
            lg = loadgen([s.grpc for s in servers], tmp, "--nodes", str(agents), "--ranks-per-node",
                         str(a.ranks_per_node), "--step-time", "0", "--sample-interval", "0",
                         "--duration", "3600", "--processes", str(a.lg_processes), "--job", JOB,
                         "--layers", str(a.layers), "--experts", str(a.experts), name=f"fanout-{agents}")
            wait_until(lambda: len(http.get("/nodes", params={"job_id": JOB}).json()) >= agents, 300, "agents",
                       interval=0.5)
            http.put(f"/jobs/{JOB}/policy", json={"mode": "manual", "min_interval_s": 1e9}).raise_for_status()
            job = http.get(f"/jobs/{JOB}").json()
            if (job["world_size"], job["slots_per_rank"]) != (world, slots):
                raise RuntimeError(f"job geometry {job['world_size']}x{job['slots_per_rank']}, expected {world}x{slots}")

            def applied(epoch: int) -> None:
                wait_until(lambda: any(p["epoch"] == epoch and p["status"] == "applied"
                                       for p in http.get(f"/jobs/{JOB}/plans", params={"limit": 3}).json()),
                           300, f"plan {epoch} applied", interval=a.poll_s)

            def operator(phy2log: np.ndarray, reason: str) -> int:
                r = http.post(f"/jobs/{JOB}/plans", json={"phy2log": phy2log.tolist(), "reason": reason})
                r.raise_for_status()
                applied(r.json()["epoch"])
                return r.json()["epoch"]

            lg_pids = [lg.pid] + [c.pid for c in psutil.Process(lg.pid).children(recursive=True)]
            serve_pids = [s.pid for s in servers]

            def rounds(targets: list[int]) -> dict[int, float]:
                """Push ``a.rounds`` plans; the pushed time by epoch. Adds the CPU seconds per round
                of serve, loadgen and PostgreSQL over these rounds to ``cpu``."""
                pushed = {}
                cpu0 = [sum(map(cpu_of, serve_pids)), sum(map(cpu_of, lg_pids)), postgres_cpu()]
                for i in range(a.rounds):
                    if i and a.settle_s:
                        time.sleep(a.settle_s)  # pacing between plans, not waiting on a state
                    r = http.post(f"/jobs/{JOB}/rollback", json={"epoch": targets[i % 2]})
                    r.raise_for_status()
                    epoch = r.json()["epoch"]
                    applied(epoch)
                    events = http.get(f"/jobs/{JOB}/plans/{epoch}").json()["events"]
                    pushed[epoch] = next(ev["ts"] for ev in events if ev["status"] == "pushed")
                cpu1 = [sum(map(cpu_of, serve_pids)), sum(map(cpu_of, lg_pids)), postgres_cpu()]
                cpu[len(cpu)] = tuple((b - a0) / a.rounds for a0, b in zip(cpu0, cpu1, strict=True))
                return pushed

            cpu: dict[int, tuple[float, ...]] = {}  # row -> (serve, loadgen, postgres) CPU s per round

            ea = operator(pa, "fanout benchmark: placement A")
            eb = operator(pb, "fanout benchmark: placement B")
            inc = rounds([ea, eb])  # B -> A -> B ...: each round changes A != B slots
            er = operator(pr, "fanout benchmark: reshuffled placement R")
            full = rounds([0, er])  # R -> identity -> R ...
            os.killpg(lg.pid, signal.SIGTERM)
            lg.wait(120)
        finally:
            for s in servers:
                s.stop()
    got = read_json(tmp, f"fanout-{agents}")["plans"]
    rows = [
        row(agents, got, inc, f"incremental ({how})", float((pa != pb).mean())) | {"cpu": cpu[0]},
        row(agents, got, full, "full (identity ↔ reshuffled)", float((pr != ident).mean())) | {"cpu": cpu[1]},
    ]
    if a.bare:
        rows += bare(agents, a, tmp, slots, {"a": pa, "b": pb, "r": pr, "ident": ident},
                     [float((pa != pb).mean()), float((pr != ident).mean())])
    return rows


def bare(agents: int, a, tmp: Path, slots: int, placements: dict, changed: list[float]) -> list[dict]:
    """The same rows against ``benchmarks.bare_fanout`` (same loadgen, same plan bytes, a
    grpc.aio server with nothing behind it): the transport's own fan-out time in this session."""
    np.savez(tmp / "placements.npz", slots=slots, **placements)
    port = free_port()
    out = tmp / f"bare-{agents}.json"
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bare_fanout", "--port", str(port), "--agents", str(agents),
         "--rounds", str(a.rounds), "--job", JOB, "--placements", str(tmp / "placements.npz"),
         "--settle-s", str(a.settle_s), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lg = None
    try:
        server.stdout.readline()  # listening
        lg = loadgen([f"127.0.0.1:{port}"], tmp, "--nodes", str(agents), "--ranks-per-node",
                     str(a.ranks_per_node), "--step-time", "0", "--sample-interval", "0",
                     "--duration", "3600", "--processes", str(a.lg_processes), "--job", JOB,
                     "--layers", str(a.layers), "--experts", str(a.experts), name=f"bare-fanout-{agents}")
        server.wait(1800)
        if server.returncode != 0:
            raise RuntimeError(f"bare fanout server exited {server.returncode}: {server.stdout.read()[-2000:]}")
    finally:
        if lg is not None:
            os.killpg(lg.pid, signal.SIGTERM)
            lg.wait(120)
        if server.poll() is None:
            server.kill()
            server.wait(10)
    res = json.loads(out.read_text())
    got = read_json(tmp, f"bare-fanout-{agents}")["plans"]
    return [row(agents, got, {int(e): t for e, t in res["pushed"][kind].items()}, f"bare transport: {kind}", c)
            | {"cpu": (res["cpu"][kind],)} for kind, c in zip(("incremental", "full"), changed, strict=True)]


def row(agents: int, got: list, pushed: dict[int, float], kind: str, changed: float) -> dict:
    per_agent, last, sizes, deltas = [], [], [], 0
    for epoch, t_push in pushed.items():
        mine = [g for g in got if g[1] == epoch]
        if len(mine) < agents:
            raise RuntimeError(f"epoch {epoch}: only {len(mine)} of {agents} agents got it")
        lat = [g[2] - t_push for g in mine]
        per_agent += lat
        last.append(max(lat))
        sizes += [g[3] for g in mine]
        deltas += sum(1 for g in mine if g[4])
    return {"agents": agents, "kind": kind, "rounds": len(pushed), "changed": changed,
            "plan_bytes": statistics.median(sizes), "delta_share": deltas / len(sizes),
            "all": percentiles(last), "agent": percentiles(per_agent)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=20, help="rounds per row")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--layers", type=int, default=58)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--moves", type=float, default=0.05, help="share of slots an incremental plan moves")
    ap.add_argument("--lg-processes", type=int, default=2)
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="pause between a round's plan being applied and the next push (seconds); the "
                         "control loop itself spaces plans by its minimum interval (10 s by default). 0: back to back, "
                         "so a round can overlap the acks and report handling of the one before")
    ap.add_argument("--poll-s", type=float, default=0.1,
                    help="period of the REST poll for a round's plan being applied (seconds); it only decides "
                         "when the next round starts, and each poll costs the serve process CPU during the fan-out")
    ap.add_argument("--no-bare", dest="bare", action="store_false",
                    help="skip the bare-transport baseline (benchmarks.bare_fanout) run after each agent count")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    rows = []
    for n in a.agents:
        mine = one(n, a, tmp)
        rows += mine
        for r in mine:
            print(r, flush=True)
    lines = [
        "Command: `.venv/bin/python -m benchmarks.fanout " + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other engineers (noisy). "
        f"{a.replicas} `moeplane serve` replica(s) on PostgreSQL{' + Redis' if a.replicas > 1 else ''}; "
        f"agents are `moeplane loadgen` streams over {a.lg_processes} processes, each node with "
        f"{a.ranks_per_node} rank(s); phy2log [{a.layers}, G*S], E = {a.experts}. Budget: p99 ≤ 200 ms.", "",
        "| agents | plans | slots changed | plan bytes per agent | sent as delta | rounds | last agent p50 ms | "
        "last agent p99 ms | per agent p50 ms | per agent p99 ms | serve CPU ms per round | "
        "loadgen CPU ms per round | PostgreSQL CPU ms per round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['agents']} | {r['kind']} | {r['changed']:.1%} | {r['plan_bytes']:,.0f} | "
                     f"{r['delta_share']:.0%} | {r['rounds']} | {r['all']['p50'] * 1e3:.1f} | "
                     f"{r['all']['p99'] * 1e3:.1f} | {r['agent']['p50'] * 1e3:.1f} | {r['agent']['p99'] * 1e3:.1f} | "
                     + " | ".join(f"{c * 1e3:.0f}" for c in r["cpu"]) + " |" + " – |" * (3 - len(r["cpu"])))
    ratios = [f"- {o['agents']} agents, {o['kind']}: last agent p50 {o['all']['p50'] / b['all']['p50']:.2f}x, "
              f"p99 {o['all']['p99'] / b['all']['p99']:.2f}x the bare transport"
              for o in rows for b in rows
              if b["agents"] == o["agents"] and b["kind"] == "bare transport: " + o["kind"].split(" (")[0]]
    if ratios:
        lines += ["", "Ours against the bare transport (`benchmarks.bare_fanout`, same loadgen and plan bytes, "
                  "run right after ours; its CPU column is the bare server's):", *ratios]
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
