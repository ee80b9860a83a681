"""Fixtures for the dashboard browser tests: a filled SQLite store, the dashboard served by a
real uvicorn server (FastAPI mounting the Dash Flask app through a2wsgi) in a background
thread, and headless Chromium driven by selenium."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, unavailable

CHROMIUM = os.environ.get("MOEPLANE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MOEPLANE_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
BROWSER_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_exc = exc
        tick.wait(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_exc})")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.migrate import upgrade
    from moeplane.controlplane.store.writes import StoreWriter
    from tests.dashboard.simjob import SimJob

    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'store.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    sim = SimJob(StoreWriter(engine), nodes=3, devices_per_node=8, layers=4, experts=48)
    t0 = time.time() - 60
    sim.hello(t0)
    for step in range(6):
        sim.samples(t0 + step)
        sim.step(step, t0 + step)
    yield engine, sim
    engine.dispose()


class DashboardServer:
    """uvicorn serving FastAPI with the Dash app mounted at /dashboard, in a thread."""

    def __init__(self, engine):
        import uvicorn
        from a2wsgi import WSGIMiddleware
        from fastapi import FastAPI

        from moeplane.dashboard.app import create_dash

        app = FastAPI()
        app.mount("/dashboard", WSGIMiddleware(create_dash(engine).server))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/dashboard/"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, name="dashboard-uvicorn", daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "uvicorn to start")
        wait_for(lambda: httpx.get(self.url + "_dash-layout", timeout=2).status_code == 200, 20,
                 "the dashboard to answer")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def dashboard_server(store) -> Iterator[DashboardServer]:
    srv = DashboardServer(store[0])
    srv.start()
    yield srv
    srv.stop()


def browser_options(profile_dir: str):
    """Headless Chromium options with a fresh profile in ``profile_dir``."""
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in BROWSER_ARGS:
        opts.add_argument(arg)
    opts.add_argument(f"--user-data-dir={profile_dir}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return opts


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        unavailable("Chromium", f"{CHROMIUM} or {CHROMEDRIVER} not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="moeplane-chromium-")
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=browser_options(profile))
    except Exception as exc:  # noqa: BLE001 - any launch failure
        shutil.rmtree(profile, ignore_errors=True)
        unavailable("Chromium", exc)
    driver.set_page_load_timeout(30)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
