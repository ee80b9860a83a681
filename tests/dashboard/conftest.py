"""Fixtures for the dashboard browser tests: a filled SQLite store, the dashboard served by a
real uvicorn server (FastAPI mounting the Dash Flask app through a2wsgi) in a background
thread, and headless Chromium driven by selenium."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.browser import CHROMEDRIVER, CHROMIUM, DashboardServer, browser_options
from moeplane.controlplane.procs import wait_until
from tests.conftest import unavailable

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """:func:`wait_until` where any exception (a stale element, a page mid-load) means not yet."""
    return wait_until(predicate, timeout, what, retry_on=(Exception,))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from harness.simjob import SimJob
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.migrate import upgrade
    from moeplane.controlplane.store.writes import StoreWriter

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


@pytest.fixture(scope="module")
def dashboard_server(store) -> Iterator[DashboardServer]:
    srv = DashboardServer(store[0])
    srv.start()
    yield srv
    srv.stop()


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
