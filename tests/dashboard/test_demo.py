"""``moeplane demo`` as a user runs it: a real subprocess tree (control plane, agents, simulated
job) on free ports and a temporary data directory; its dashboard in headless Chromium shows the
expert heatmap with data and updates live; Ctrl-C (SIGINT) stops every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import free_port
from tests.dashboard.browsing import figure, mark_page, still_same_page, text_of
from tests.dashboard.conftest import SCREENSHOTS, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NODES = 2


def step_shown(driver) -> int | None:
    words = text_of(driver, "experts-status").replace("·", " ").split()
    return int(words[words.index("step") + 1]) if "step" in words else None


def test_demo_serves_a_live_dashboard_and_ctrl_c_stops_everything(tmp_path, browser):
    http_port, grpc_port = free_port(), free_port()
    log = tmp_path / "demo.out"
    argv = [sys.executable, "-m", "moeplane.controlplane.cli.main", "demo", "--data-dir", str(tmp_path / "data"),
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--nodes", str(NODES),
            "--gpus-per-node", "2", "--layers", "4", "--experts", "8", "--step-time", "0.5", "--steps", "0"]
    with open(log, "wb") as out:
        demo = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})
    children: list[psutil.Process] = []
    try:
        wait_for(lambda: demo.poll() is not None or "Ctrl-C stops everything" in log.read_text(), 60,
                 "the demo to print its URLs")
        assert demo.poll() is None, log.read_text()
        url = f"http://127.0.0.1:{http_port}/dashboard/"
        assert url in log.read_text()
        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) >= 1 + NODES + 1  # control plane, one agent per node, the simulated job

        browser.get(url + "experts")
        mark_page(browser)

        def heatmap_with_data():
            fig = figure(browser, "expert-heatmap")
            z = (fig or {"data": [{}]})["data"][0].get("z") or []
            return z if z and any(v for row in z for v in row) else None

        z = wait_for(heatmap_with_data, 30, "the expert heatmap to show loads")
        assert len(z) == 4 and len(z[0]) == 8
        first = wait_for(lambda: step_shown(browser), 10, "the step in the status line")
        wait_for(lambda: (step_shown(browser) or -1) > first, 15, "a newer step without a reload")
        assert still_same_page(browser), "the page reloaded"
        browser.save_screenshot(str(SCREENSHOTS / "demo-experts.png"))
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
        try:
            rc = demo.wait(30)
        finally:
            gone, alive = psutil.wait_procs(children, timeout=10)
            for p in alive:  # do not leak processes from a failed test
                p.kill()
    assert rc == 0, log.read_text()
    assert "moeplane demo stopped" in log.read_text()
    assert alive == [], f"still running after Ctrl-C: {[p.pid for p in alive]}"
