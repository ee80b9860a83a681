"""RL timeline render: a 1,000-step timeline of 256 devices in <= 2 s in the browser, <= 300 ms
on the server.

    .venv/bin/python -m benchmarks.rl_render --reps 3 --out docs/bench-rl.md

Per store (SQLite, PostgreSQL): a job of 1,000 steps x 256 devices x 10 phase spans (2.56 M
spans, written through the store's RL writer in 50-step reports, not over gRPC) and, as the
same-run baseline, a small job of 10 steps x 8 devices (800 spans).

- Server: the RL page's timeline callback body (``rl_callbacks.timeline``: the per-step phase
  seconds kept at ingest read and decoded, the device x step grid above ``GANTT_MAX_SPANS``
  spans, the figure) plus the figure's JSON, split into its parts; and, for comparison, the
  floor of any view computed from the raw spans: the range's spans counted by the database
  alone (``count(*)``), no row leaving it.
- Browser: headless Chromium on a real uvicorn server (as ``moeplane serve``); the RL page is
  loaded, the range typed in the step-range picker, and the clock runs in the page from the
  click on Show until the new timeline is drawn (``performance.now()``). The page's other
  callbacks (the idle analysis of the newest 100k spans of the range) run at the same time, as
  they do for a user.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.scaleharness import pg_database, sqlite_database
from harness.browser import CHROMEDRIVER, DashboardServer, browser_options
from harness.simjob import SimJob
from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl.phases import PHASE_CODE, ROLE_CODE, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store import rl_steps
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.dashboard import rl_callbacks
from moeplane.dashboard import rl_views as V

BIG, SMALL = ("rl-big", 1000, 256), ("rl-small", 10, 8)  # job, steps, devices
# a colocated step of one device: (phase, seconds); generate has a long tail
PLAN = (("generate", 30.0), ("reward", 2.0), ("logprob_old", 3.0), ("logprob_ref", 3.0), ("advantage", 0.5),
        ("wait", 1.0), ("train_update", 12.0), ("weight_sync", 2.0), ("offload", 1.0), ("onload", 1.0))
STEP_S = 70.0


def fill(engine, job: str, steps: int, devices: int, chunk: int = 50) -> int:
    """Write ``steps`` x ``devices`` x len(PLAN) spans; returns how many."""
    SimJob(StoreWriter(engine), job_id=job, nodes=max(1, devices // 8), devices_per_node=min(devices, 8),
           layers=2, experts=8).hello(1e9)
    rng = np.random.default_rng(0)
    base = np.array([s for _, s in PLAN])
    codes = np.array([PHASE_CODE[p] for p, _ in PLAN])
    total = 0
    for s0 in range(0, steps, chunk):
        n_steps = min(chunk, steps - s0)
        dur = np.tile(base, (n_steps, devices, 1))
        dur[:, :, 0] *= rng.lognormal(0.0, 0.25, (n_steps, devices))  # generation tail
        start = 1e9 + (s0 + np.arange(n_steps))[:, None, None] * STEP_S + np.cumsum(dur, axis=2) - dur
        step = np.broadcast_to(s0 + np.arange(n_steps)[:, None, None], dur.shape).ravel()
        rank = np.broadcast_to(np.arange(devices)[None, :, None], dur.shape).ravel()
        phase = np.broadcast_to(codes, dur.shape).ravel()
        spans = Spans.build(step, rank, step, phase, np.full(step.size, ROLE_CODE["hybrid"]), start.ravel(),
                            (start + dur).ravel(), np.zeros(step.size, dtype=int))
        store_rl.save_report(engine, job, "node-0", spans)
        total += len(spans)
    return total


def med(xs):
    return statistics.median(xs)


def bare_count(engine, job: str, steps: int) -> float:
    """Seconds for the database to count the range's spans (the floor of any read of them)."""
    import sqlalchemy as sa

    t = time.perf_counter()
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT count(*) FROM rl_spans WHERE job_id = :j AND step >= 0 AND step < :s"),
                     {"j": job, "s": steps}).scalar()
    return time.perf_counter() - t


def query_plan(engine, job: str, steps: int) -> str:
    import sqlalchemy as sa

    sql = f"SELECT step, phases, ranks, data FROM rl_step_phases WHERE job_id = '{job}' AND step >= 0 AND step < {steps}"
    explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    with engine.connect() as conn:
        rows = conn.execute(sa.text(explain + sql)).all()
    return " / ".join(str(r[-1]) for r in rows)


def bench_server(engine, reps: int) -> dict:
    """The timeline callback's body, whole and (above GANTT_MAX_SPANS) part by part in one pass:
    the summary rows' read and decode, the device x step grid, the figure and its JSON."""
    out = {}
    for job, steps, _devices in (SMALL, BIG):
        total, read, grid, figure = [], [], [], []
        for _ in range(reps):
            t = time.perf_counter()
            body = rl_callbacks.timeline(engine, job, 0, steps).to_json()
            total.append(time.perf_counter() - t)
            t0 = time.perf_counter()
            step, records = rl_steps.read(engine, job, 0, steps)
            t1 = time.perf_counter()
            g = sp.grid(step, records)
            t2 = time.perf_counter()
            V.step_grid_figure(g).to_json()
            read.append(t1 - t0)
            grid.append(t2 - t1)
            figure.append(time.perf_counter() - t2)
        out[job] = {"spans": g.spans, "per_step": g.spans > rl_callbacks.GANTT_MAX_SPANS, "summary_records": int(step.size),
                    "callback_s": med(total), "read_s": med(read), "grid_s": med(grid),
                    "grid_figure_json_s": med(figure), "json_bytes": len(body),
                    "bare_count_s": med([bare_count(engine, job, steps) for _ in range(reps)]),
                    "plan": query_plan(engine, job, steps)}
    return out


_DRAWN = """
const [expect, before, done] = arguments;
const g = () => document.querySelector('#rl-timeline .js-plotly-plot');
function ready() {
  const p = g();
  if (!p || !p.data || !p.data[0] || !p.layout || !p.layout.title) return false;
  if (expect.heatmap) return p.layout.title.text !== before && p.data[0].type === 'heatmap'
      && p.data[0].y.length === expect.rows
      && p.querySelector('.heatmaplayer image, .heatmaplayer') !== null;
  let n = 0; for (const t of p.data) if (t.type === 'bar') n += t.y.length;
  return n === expect.bars && p.querySelectorAll('.bars path').length > 0;
}
const t0 = performance.now();
document.getElementById('rl-apply').click();
(function poll() { if (ready()) done(performance.now() - t0); else requestAnimationFrame(poll); })();
"""


def bench_browser(engine, reps: int) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.keys import Keys

    from moeplane.controlplane.procs import wait_until

    def wait(pred, what, timeout=120.0):
        return wait_until(pred, timeout, what, retry_on=(Exception,))

    srv = DashboardServer(engine).start()
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=browser_options(tempfile.mkdtemp()))
    driver.set_script_timeout(120)
    out = {}
    try:
        for job, steps, devices in (SMALL, BIG):
            last = steps - 1 if job == BIG[0] else steps - 2  # the small job's default view is all 10 steps
            spans = (last + 1) * devices * len(PLAN)
            expect = {"heatmap": spans > rl_callbacks.GANTT_MAX_SPANS, "rows": devices, "bars": spans}
            times = []
            for _ in range(reps):
                driver.get("about:blank")
                driver.get(srv.url + "rl")
                box = wait(lambda: driver.find_element("css selector", "#job-select input"), "job box")
                if driver.execute_script("var e=document.getElementById('job-select');return e.innerText;") != job:
                    box.send_keys(job)
                    box.send_keys(Keys.ENTER)
                wait(lambda j=job: j in driver.find_element("id", "rl-trace-link").get_attribute("href"), "job shown")
                wait(lambda: "black hole" in driver.find_element("id", "rl-summary").text, "the default view")
                for element_id, text in (("rl-from", "0"), ("rl-to", str(last))):
                    driver.find_element("id", element_id).send_keys(text)
                wait(lambda v=str(last): driver.find_element("id", "rl-to").get_attribute("value") == v, "typed")
                before = driver.execute_script(
                    "var p=document.querySelector('#rl-timeline .js-plotly-plot');return p.layout.title.text;")
                times.append(driver.execute_async_script(_DRAWN, expect, before) / 1000.0)
            out[job] = {"spans": spans, "per_step": expect["heatmap"], "times_s": times, "median_s": med(times)}
    finally:
        driver.quit()
        srv.stop()
    return out


def run_store(url: str, reps: int) -> dict:
    upgrade(url)
    engine = make_engine(url)
    t = time.perf_counter()
    n = {job: fill(engine, job, steps, devices) for job, steps, devices in (SMALL, BIG)}
    fill_s = time.perf_counter() - t
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE rl_spans")
            conn.exec_driver_sql("ANALYZE rl_step_phases")
    res = {"spans": n, "fill_s": fill_s, "server": bench_server(engine, reps), "browser": bench_browser(engine, reps)}
    engine.dispose()
    return res


def main() -> None:
    global BIG
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--store", choices=("sqlite", "postgres"), action="append")
    p.add_argument("--json", type=Path, default=Path("artifacts/bench-rl-render.json"))
    p.add_argument("--steps", type=int, default=BIG[1], help="steps of the large job (smoke runs: fewer)")
    a = p.parse_args()
    BIG = (BIG[0], a.steps, BIG[2])
    results = {"python": platform.python_version()}
    for store in a.store or ("sqlite", "postgres"):
        with (pg_database() if store == "postgres" else sqlite_database()) as url:
            results[store] = run_store(url, a.reps)
            print(json.dumps({store: results[store]}, indent=1), flush=True)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
