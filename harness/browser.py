"""The dashboard in a thread (uvicorn serving FastAPI with the Dash app mounted through a2wsgi,
as ``moeplane serve`` does) and headless Chromium options, for the browser tests and the
dashboard benchmark."""

from __future__ import annotations

import os
import threading

from moeplane.controlplane.procs import free_port, http_ok, wait_until

CHROMIUM = os.environ.get("MOEPLANE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MOEPLANE_CHROMEDRIVER", "/usr/bin/chromedriver")
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


class DashboardServer:
    """uvicorn serving FastAPI with ``create_dash(engine, **dash_kwargs)`` mounted at
    /dashboard, in a thread."""

    def __init__(self, engine, **dash_kwargs):
        import uvicorn
        from a2wsgi import WSGIMiddleware
        from fastapi import FastAPI

        from moeplane.dashboard.app import create_dash

        app = FastAPI()
        app.mount("/dashboard", WSGIMiddleware(create_dash(engine, **dash_kwargs).server))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/dashboard/"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, name="dashboard-uvicorn", daemon=True)

    def start(self) -> DashboardServer:
        self.thread.start()
        wait_until(lambda: self.server.started, 20, "uvicorn to start")
        wait_until(lambda: http_ok(self.url + "_dash-layout"), 20, "the dashboard to answer")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


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
