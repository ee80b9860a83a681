"""A demo's plans: predicted against measured balancedness (issue 31: within 2 % on average and
5 % for every plan over the plans of a 10-minute run).

    .venv/bin/python -m benchmarks.predictions --steps 600      # about 13 minutes on 2 cores

starts ``moeplane demo --no-train --steps 600`` on free ports in a temporary directory, waits
for the simulated job's last step and the last plan's measurement, and stops it; with ``--url``
and ``--database`` it reads a demo that is already running instead.

Reads the plans from REST (``predicted_after``, ``measured_after``: what the Plans page shows).
Error of a plan: ``|measured - predicted| / measured``. Baseline, same run and plans: the
in-sample figure the controller used before, each pushed placement scored with routing on the
window it was fitted to (the ``window_steps`` steps up to the last one stored when the plan
was created; loads and placements from the database).

``--recompute`` adds a row: this version's ``expected_balancedness`` of the same pushed
placements, recomputed offline from the windows the controller saw (as the baseline's; ahead:
``measured_steps`` at the window's mean step time). A plan decided on fewer steps than were
stored by its ``created_at`` (the decision ran while later steps arrived) takes
``--seen EPOCH=LAST:AHEAD``: its window ends at step LAST and it looks AHEAD steps ahead (found
by reproducing the pushed figure with the version that pushed it). For a real run:

    .venv/bin/python -m benchmarks.predictions --url http://127.0.0.1:PORT \
        --database /tmp/tm/tm.sqlite --job train-moe --recompute --seen 1=2:9
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import httpx
import numpy as np

from moeplane.controlplane.balancing import routed_balancedness
from moeplane.controlplane.balancing.prediction import (
    MEASURE_STEPS,
    expected_balancedness,
    measured_steps,
)
from moeplane.controlplane.procs import MOEPLANE, free_port, wait_until
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.engine import make_engine


def every_page(read, engine, job: str) -> list[dict]:
    """Every row of a step-ordered history read (``q.loads_history``, ``q.step_stats_history``:
    one row per step, or per step and rank), in pages of at most ``MAX_LIMIT`` rows; a full
    page's last step is read again whole with the next page."""
    rows: list[dict] = []
    start = 0
    while True:
        page = read(engine, job, q.Range(step_start=start, limit=q.MAX_LIMIT))
        if len(page) < q.MAX_LIMIT:
            return rows + page
        if page[0]["step"] == page[-1]["step"]:
            raise RuntimeError(f"step {page[0]['step']}: more than {q.MAX_LIMIT} rows")
        start = page[-1]["step"]
        rows += [r for r in page if r["step"] < start]


def windows(database: str, job: str, plans: list[dict],
            seen: dict[int, tuple[int, int]] | None = None):
    """Yield (plan, window [W, L, E] tokens, ahead steps, phy2log [L, G*S]) for each plan: the
    ``window_steps`` steps up to the last one stored when it was created (or ``seen[epoch]``'s
    last step), and ``measured_steps`` at the window's mean step time (or ``seen``'s count)."""
    engine = make_engine(f"sqlite:///{database}")
    rows = every_page(q.loads_history, engine, job)
    ts = np.array([r["ts"] for r in rows])
    steps = [r["step"] for r in rows]
    policy = P.get_policy(engine, job)
    stats = every_page(q.step_stats_history, engine, job)
    for p in plans:
        last = int(np.searchsorted(ts, p["created_at"], side="right")) - 1
        n = None
        if seen and p["epoch"] in seen:
            last_step, n = seen[p["epoch"]]
            last = steps.index(last_step)
        lo = max(0, last - policy.window_steps + 1)
        loads = np.stack([r["counts"] for r in rows[lo : last + 1]]).astype(np.float64)
        if n is None:
            times = [s["step_time_s"] for s in stats if steps[lo] <= s["step"] <= steps[last]]
            ahead = measured_steps(policy.min_interval_s, float(np.mean(times)) if times else 1.0)
        else:
            ahead = measured_steps(0.0, 1.0)[0] + np.arange(n)
        yield p, loads, tuple(int(a) for a in ahead), P.get_plan(engine, job, p["epoch"])["phy2log"]


def in_sample(windowed: list[tuple]) -> dict[int, float]:
    """epoch -> the placement's mean routed balancedness over the steps it was fitted to
    (``windowed``: ``windows``' tuples)."""
    return {p["epoch"]: float(routed_balancedness(loads, p2l, gpus=p["world_size"]).mean())
            for p, loads, _, p2l in windowed}


def recomputed(windowed: list[tuple]) -> dict[int, float]:
    """epoch -> this version's ``expected_balancedness`` of the pushed placement."""
    return {p["epoch"]: float(expected_balancedness(loads, [p2l], gpus=p["world_size"],
                                                    ahead=ahead)[0].mean())
            for p, loads, ahead, p2l in windowed}


def errors(plans: list[dict], predicted: dict[int, float]) -> np.ndarray:
    """[n] signed (measured - predicted) / measured of each plan, in %."""
    return np.array([(p["measured_after"] - predicted[p["epoch"]]) / p["measured_after"] * 100
                     for p in plans])


def row(name: str, plans: list[dict], predicted: dict[int, float]) -> str:
    e = errors(plans, predicted)
    worst = int(np.argmax(np.abs(e)))
    w = plans[worst]
    late = np.abs(e[[p["applied_step"] >= 300 for p in plans]])
    tail = f"{len(late)}: {late.mean():.1f} %, {late.max():.1f} %" if len(late) else "none"
    return (f"| {name} | {len(plans)} | {np.abs(e).mean():.1f} % | {np.abs(e).max():.1f} % (plan "
            f"{w['epoch']}: {predicted[w['epoch']]:.3f} vs {w['measured_after']:.3f}) | "
            f"{e.mean():+.1f} % | {(np.abs(e) > 5).sum()} | {tail} |")


def report(url: str, database: str, job: str, *, recompute: bool = False,
           seen: dict[int, tuple[int, int]] | None = None) -> None:
    got = httpx.get(f"{url}/api/v1/jobs/{job}/plans", params={"limit": 1000}, timeout=30)
    got.raise_for_status()
    plans = sorted((p for p in got.json() if p["measured_after"] is not None
                    and p["predicted_after"] is not None), key=lambda p: p["epoch"])
    print("| prediction | plans measured | mean abs(measured − predicted) / measured | worst | "
          "mean signed | plans over 5 % | applied from step 300 on: plans, mean, worst |")
    print("|---|---|---|---|---|---|---|")
    windowed = list(windows(database, job, plans, seen))  # the database read once
    print(row("in-sample (baseline: the window it was fitted to)", plans, in_sample(windowed)))
    print(row("out of sample (`expected_balancedness`, pushed)", plans,
              {p["epoch"]: p["predicted_after"] for p in plans}))
    if recompute:
        print(row("out of sample, this version (recomputed offline)", plans,
                  recomputed(windowed)))


def run_demo(steps: int, job: str) -> None:
    """A fresh demo until the job's last step and the last plan's measurement; then report."""
    with tempfile.TemporaryDirectory() as d:
        tmp, http = Path(d), free_port()
        url = f"http://127.0.0.1:{http}"
        with open(tmp / "demo.out", "wb") as out:
            demo = subprocess.Popen(
                MOEPLANE + ["demo", "--no-train", "--steps", str(steps), "--data-dir",
                            str(tmp / "data"), "--http-port", str(http), "--grpc-port", str(free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
        try:
            def last_step() -> bool:
                jobs = httpx.get(f"{url}/api/v1/jobs", timeout=5).json()
                return any(j["job_id"] == job and (j["latest_step"] or 0) >= steps - 1 for j in jobs)

            def measured() -> bool:  # the newest applied plan measured up to the last step
                plans = httpx.get(f"{url}/api/v1/jobs/{job}/plans", timeout=5).json()
                done = [p for p in plans if p["applied_step"] is not None]
                p = max(done, key=lambda p: p["epoch"], default=None)
                return p is None or (p["measured_step"] or -1) >= min(
                    p["applied_step"] + MEASURE_STEPS, steps - 1)

            wait_until(last_step, steps * 5.0, f"{job} to reach step {steps - 1}",
                       retry_on=(httpx.HTTPError,), interval=2.0)
            wait_until(measured, 60, "the last plan's measurement", retry_on=(httpx.HTTPError,),
                       interval=1.0)
            report(url, str(tmp / "data" / "moeplane.sqlite"), job)
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="steps of the demo's simulated job")
    ap.add_argument("--url", help="a running demo's REST base URL (with --database)")
    ap.add_argument("--database", help="that demo's SQLite file")
    ap.add_argument("--job", default="demo-job")
    ap.add_argument("--recompute", action="store_true",
                    help="add this version's prediction of the same plans, recomputed offline")
    ap.add_argument("--seen", action="append", default=[], metavar="EPOCH=LAST:AHEAD",
                    help="the window of plan EPOCH ends at step LAST and looks AHEAD steps ahead")
    a = ap.parse_args()
    try:
        seen = {int(e): (int(last), int(n)) for e, rest in (x.split("=") for x in a.seen)
                for last, n in [rest.split(":")]}
    except ValueError:
        ap.error("--seen takes EPOCH=LAST:AHEAD")
    if a.url:
        if not a.database:
            ap.error("--url needs --database")
        report(a.url, a.database, a.job, recompute=a.recompute, seen=seen)
    else:
        run_demo(a.steps, a.job)


if __name__ == "__main__":
    main()
