"""``moeplane demo`` as a user runs it, with its defaults: a real subprocess tree (control plane,
agents, the simulated job and the real training job ``examples/train_moe.py`` on 4 gloo ranks)
on free ports and a temporary data directory.

Within 90 s both jobs have loads, applied plans and memory profiles, and the simulated job an
applied offload decision with its measured peak; headless Chromium then opens every page for
both jobs (screenshots under ``artifacts/screenshots/demo-*.png``) and sees a host-bound spell
flagged on the cluster page; the curl lines the demo prints answer; Ctrl-C stops everything.
The demo's CPU and the dashboard's first view while it runs are measured by
``benchmarks/demo.py`` (docs/bench-demo.md).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from selenium.webdriver.common.keys import Keys

from moeplane.controlplane import demo as demo_module
from moeplane.controlplane.procs import free_port
from moeplane.dashboard.pages import PAGES
from tests.dashboard.browsing import (
    click,
    figure,
    mark_page,
    severe_console_errors,
    still_same_page,
    text_of,
)
from tests.dashboard.conftest import SCREENSHOTS, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.torch]

# job -> (layers, experts, devices): the demo's defaults
JOBS = {"demo-job": (12, 48, 32), "train-moe": (4, 16, 4)}
READY_S = 90.0  # the promise: data from both jobs on every page within 90 s


@dataclass
class RunningDemo:
    popen: subprocess.Popen
    log: Path
    base: str
    started: float
    children: list[psutil.Process] = field(default_factory=list)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def api(self, path: str):
        r = httpx.get(f"{self.base}/api/v1{path}", timeout=10)
        r.raise_for_status()
        return r.json()

    def errors(self) -> str:
        """Tracebacks and errors the demo's children logged (for a failure's message)."""
        lines = [f"{log.name}: {x}" for log in sorted(self.log.parent.glob("data/logs/*.log"))
                 for x in log.read_text(errors="replace").splitlines()
                 if "Error" in x or "Traceback" in x or " ERROR " in x]
        return "\n".join(lines[-40:])

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.popen.pid)
        return [root, *root.children(recursive=True)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("demo")
    http_port, grpc_port = free_port(), free_port()
    log = tmp / "demo.out"
    argv = [sys.executable, "-m", "moeplane.controlplane.cli.main", "demo", "--data-dir",
            str(tmp / "data"), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 env=os.environ | {"PYTHONUNBUFFERED": "1"})
    running = RunningDemo(popen, log, f"http://127.0.0.1:{http_port}", time.monotonic())
    try:
        wait_for(lambda: popen.poll() is not None or "Ctrl-C stops everything" in running.output(),
                 60, "the demo to print what to look at")
        assert popen.poll() is None, running.output()
        yield running
    finally:
        if popen.poll() is None:
            running.children = running.processes()[1:]
            popen.send_signal(signal.SIGINT)
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
        for p in running.children:  # never leak processes from a failed test
            if p.is_running():
                p.kill()


def ready(demo: RunningDemo) -> bool:
    """Both jobs stepping with applied plans and memory profiles; an applied and measured
    offload decision in the simulated job."""
    jobs = {j["job_id"]: j for j in demo.api("/jobs")}
    if any((jobs.get(j) or {}).get("latest_step") is None for j in JOBS):
        return False
    for job, (_l, _e, devices) in JOBS.items():
        if not any(p["status"] == "applied" for p in demo.api(f"/jobs/{job}/plans")):
            return False
        if len(demo.api(f"/jobs/{job}/memory")) != devices:
            return False
    return any(d["status"] == "applied" and d["measured_used_bytes"]
               for d in demo.api("/jobs/demo-job/offload/decisions"))


def select_job(driver, job: str) -> None:
    box = wait_for(lambda: driver.find_element("css selector", "#job-select input"), what="job box")
    box.send_keys(job)
    box.send_keys(Keys.ENTER)
    wait_for(lambda: text_of(driver, "job-select") == job, what=f"{job} selected")


def has_data(fig) -> bool:
    z = ((fig or {}).get("data") or [{}])[0].get("z") or []
    return bool(z) and any(v for row in z for v in row if v is not None)


def experts_shown(driver, job: str) -> bool:
    layers, experts, _ = JOBS[job]
    z = figure(driver, "expert-heatmap")["data"][0]["z"]
    return (f"job {job}" in text_of(driver, "experts-status") and len(z) == layers
            and len(z[0]) == experts and has_data(figure(driver, "expert-heatmap")))


def plans_shown(driver, job: str) -> bool:
    timeline = figure(driver, "plans-timeline")
    return (f"job {job}" in text_of(driver, "plans-status")
            and "applied" in text_of(driver, "plans-table") and bool(timeline["data"]))


def memory_shown(driver, job: str) -> bool:
    bars = figure(driver, "memory-breakdown")["data"][0]["x"]
    table = text_of(driver, "offload-table")
    decided = job != "demo-job" or ("applied" in table and re.search(r"\d+\.\d GiB\s", table))
    return f"job {job}" in text_of(driver, "memory-status") and len(bars) == JOBS[job][2] and bool(decided)


def history_shown(driver, job: str) -> bool:
    return f"job {job}" in text_of(driver, "history-status") and has_data(
        figure(driver, "history-heatmap"))


def rl_shown(driver, job: str) -> bool:
    """The timeline, the summary and the MoE policy's loads by phase (rollout and training)."""
    return bool((figure(driver, "rl-timeline") or {}).get("data")) and bool(
        text_of(driver, "rl-summary")) and len((figure(driver, "rl-loads") or {}).get(
            "data") or []) >= 2


SHOWN = {"experts": experts_shown, "plans": plans_shown, "memory": memory_shown,
         "history": history_shown}  # the RL page shows RL jobs only: checked with the RL job

def test_every_page_shows_both_jobs_within_90_s(demo, browser):
    try:
        check_every_page(demo, browser)
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{exc}\nerrors the demo logged:\n{demo.errors()}") from exc


def check_every_page(demo: RunningDemo, browser) -> None:
    wait_for(lambda: ready(demo), READY_S - (time.monotonic() - demo.started),
             "loads, applied plans and memory of both jobs and an applied offload decision")
    url = demo.base + "/dashboard/"

    # the cluster page: every device of both jobs; a slow data loader flagged by the 30 % rule
    devices = [d["device_id"] for d in demo.api("/devices")]
    assert {d.split("/")[0] for d in devices} >= {"node-0", "node-3", "cpu-0"}
    browser.get(url)
    click(browser, "xpath", "//label[contains(., 'Host-bound ratio')]")

    def spell_flagged():
        fig = figure(browser, "cluster-grid")
        hover = str(fig["data"][0]["text"])
        flagged = re.search(r"(\d+) host-bound ≥ 30 %", text_of(browser, "cluster-summary"))
        return (all(d in hover for d in devices) and "Host-bound" in str(fig["layout"]["title"])
                and flagged and int(flagged[1]) >= 8 and len(fig["data"][1]["x"]) >= 8)

    wait_for(spell_flagged, 60, "a node's devices flagged host-bound (the first spell: step 30)")
    browser.save_screenshot(str(SCREENSHOTS / "demo-cluster.png"))

    # every other page, for each job
    for job in JOBS:
        browser.get(url + "experts")
        select_job(browser, job)
        for slug, _label in PAGES:
            if slug == "cluster":
                continue
            click(browser, "id", f"nav-{slug}")  # client-side: the job stays selected
            if slug == "history":
                click(browser, "id", "history-apply")
            check = SHOWN.get(slug)
            if check is not None:
                wait_for(lambda c=check, j=job: c(browser, j), 30, f"the {slug} page of {job}")
            browser.save_screenshot(str(SCREENSHOTS / f"demo-{slug}-{job}.png"))
        assert severe_console_errors(browser) == []

    # live: a newer step without a reload
    click(browser, "id", "nav-experts")
    mark_page(browser)

    def step_shown() -> int:
        words = text_of(browser, "experts-status").replace("·", " ").split()
        return int(words[words.index("step") + 1])

    first = wait_for(step_shown, what="the step in the status line")
    wait_for(lambda: step_shown() > first, 15, "a newer step without a reload")
    assert still_same_page(browser), "the page reloaded"

    # the RL page, with the demo's RL job
    rl_job = getattr(demo_module, "RL_JOB", None)
    if "rl" in dict(PAGES) and rl_job:
        browser.get(url + "rl")
        select_job(browser, rl_job)
        wait_for(lambda: rl_shown(browser, rl_job), 60, f"the RL page of {rl_job}")
        browser.save_screenshot(str(SCREENSHOTS / f"demo-rl-{rl_job}.png"))


def test_printed_curl_lines_answer(demo):
    lines = [x.strip() for x in demo.output().splitlines() if x.strip().startswith("curl -s ")]
    assert any("/plans/1" in x for x in lines) and any("view=expert" in x for x in lines)
    for line in lines:
        target = line.removeprefix("curl -s ").strip("'")
        r = wait_for(lambda t=target: (r := httpx.get(t, timeout=10)).status_code == 200 and r,
                     60, target)
        assert r.json(), target


def test_training_job_is_restarted_where_it_left_off(demo):
    """A rank that dies ends torchrun; the demo starts the training again, numbering its steps
    past every step already stored."""
    ranks = [p for p in demo.processes() if "train_moe.py" in " ".join(p.cmdline())
             and "torch.distributed.run" not in " ".join(p.cmdline())]
    assert len(ranks) == 4
    before = demo.api("/jobs/train-moe")["latest_step"]
    ranks[1].kill()
    said = wait_for(lambda: re.search(r"train-moe exited with -?\d+; restarting it at step (\d+)",
                                      demo.output()), 60, "the demo to restart the training job")
    first = int(said[1])
    assert first > before
    wait_for(lambda: demo.api("/jobs/train-moe")["latest_step"] >= first + 3, 90,
             "steps of the restarted training job")
    assert not any(p.is_running() for p in ranks)


def test_ctrl_c_stops_everything(demo):
    demo.children = demo.processes()[1:]
    assert len(demo.children) >= 1 + 4 + 1 + 1 + 1 + 4  # serve, agents, jobs, torchrun's ranks
    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(30) == 0, demo.output()
    assert "moeplane demo stopped" in demo.output()
    _gone, alive = psutil.wait_procs(demo.children, timeout=10)
    assert alive == [], f"still running after Ctrl-C: {[p.pid for p in alive]}"
