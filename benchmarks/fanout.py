"""Plan fan-out: a plan committed (its ``pushed`` event) → every agent of the job has it.

    .venv/bin/python -m benchmarks.fanout --agents 256 1024 --rounds 20 --out docs/bench-fanout.md

Real ``moeplane serve`` on a fresh PostgreSQL database (in-process bus; with ``--replicas 2``
two serve processes share Redis and the agents are spread over them); the agents are
``moeplane loadgen`` streams (one node each, ``--ranks-per-node`` ranks) that report every
plan as applied. Each round asks REST for a rollback to the initial placement (a new plan,
pushed at once), waits until the plan is applied by every node, and takes each agent's
receive time minus the plan's ``pushed`` event time (one clock: loopback). Reported per
round: the time until the LAST agent had it (p50/p99 over rounds), and per agent (p50/p99).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.scaleharness import REDIS, loadgen, pg_database, read_json, start_serve
from controlplane.loadgen.stats import percentiles

JOB = "fanout"


def wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(what)


def one(agents: int, a, tmp: Path) -> dict:
    with pg_database() as url:
        servers = [start_serve(url, tmp, redis_url=REDIS if a.replicas > 1 else "", name=f"fanout-{agents}-{i}")
                   for i in range(a.replicas)]
        try:
            http = httpx.Client(base_url=servers[0].http + "/api/v1", timeout=60)
            lg = loadgen([s.grpc for s in servers], tmp, "--nodes", str(agents), "--ranks-per-node",
                         str(a.ranks_per_node), "--step-time", "0", "--sample-interval", "0",
                         "--duration", "3600", "--processes", str(a.lg_processes), "--job", JOB,
                         "--layers", str(a.layers), "--experts", str(a.experts), name=f"fanout-{agents}")
            wait(lambda: len(http.get("/nodes", params={"job_id": JOB}).json()) >= agents, 300, "agents")
            http.put(f"/jobs/{JOB}/policy", json={"mode": "manual"})
            pushed: dict[int, float] = {}
            for _ in range(a.rounds):
                r = http.post(f"/jobs/{JOB}/rollback", json={"epoch": 0})
                r.raise_for_status()
                epoch = r.json()["epoch"]
                wait(lambda e=epoch: http.get(f"/jobs/{JOB}/plans/{e}").json()["status"] == "applied",
                     300, f"plan {epoch} applied")
                events = http.get(f"/jobs/{JOB}/plans/{epoch}").json()["events"]
                pushed[epoch] = next(ev["ts"] for ev in events if ev["status"] == "pushed")
            os.killpg(lg.pid, signal.SIGTERM)
            lg.wait(120)
            plan_bytes = int(a.layers * max(agents * a.ranks_per_node, a.experts) * 8)
        finally:
            for s in servers:
                s.stop()
    got = read_json(tmp, f"fanout-{agents}")["plans"]
    per_agent, last = [], []
    for epoch, t_push in pushed.items():
        lat = [t - t_push for _node, e, t in got if e == epoch]
        if len(lat) < agents:
            raise RuntimeError(f"epoch {epoch}: only {len(lat)} of {agents} agents got it")
        per_agent += lat
        last.append(max(lat))
    return {"agents": agents, "rounds": len(pushed), "plan_bytes": plan_bytes,
            "all": percentiles(last), "agent": percentiles(per_agent)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--layers", type=int, default=58)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--lg-processes", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    rows = []
    for n in a.agents:
        rows.append(one(n, a, tmp))
        print(rows[-1], flush=True)
    lines = [
        "# Plan fan-out", "",
        "Command: `.venv/bin/python -m benchmarks.fanout " + " ".join(argv if argv is not None else sys.argv[1:]) + "`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other engineers (noisy). "
        f"{a.replicas} `moeplane serve` replica(s) on PostgreSQL{' + Redis' if a.replicas > 1 else ''}; "
        f"agents are `moeplane loadgen` streams over {a.lg_processes} processes, each node with "
        f"{a.ranks_per_node} rank(s); plan phy2log is int64 [{a.layers}, G*S]. Budget: p99 ≤ 200 ms.", "",
        "| agents | plan bytes | rounds | last agent p50 ms | last agent p99 ms | per agent p50 ms | per agent p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['agents']} | {r['plan_bytes']:,} | {r['rounds']} | {r['all']['p50'] * 1e3:.1f} | "
                     f"{r['all']['p99'] * 1e3:.1f} | {r['agent']['p50'] * 1e3:.1f} | {r['agent']['p99'] * 1e3:.1f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        a.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
