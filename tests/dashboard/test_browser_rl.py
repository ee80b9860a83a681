"""The RL page in headless Chromium: timeline, per-step bars, idle heatmap, tail, staleness and
weight sync of stored spans (written through the store's RL writer, as ingest does)."""

from __future__ import annotations

import pytest

from moeplane.controlplane.rl.phases import PHASES, Spans
from moeplane.controlplane.store import rl as store_rl
from tests.dashboard.browsing import figure, severe_console_errors, text_of
from tests.dashboard.conftest import SCREENSHOTS, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _fill(engine, job: str) -> None:
    """Three colocated steps of four devices: rank 3 has the generation tail."""
    rows = []
    for step in range(3):
        t = 1000.0 + 60 * step
        for rank in range(4):
            gen = 20.0 + (10.0 if rank == 3 else 0.0)
            rows += [(step, rank, step, "generate", "hybrid", t, t + gen, 500),
                     (step, rank, step, "offload", "hybrid", t + 30, t + 31, 0),
                     (step, rank, step, "train_update", "hybrid", t + 31, t + 50, 0),
                     (step, rank, step, "weight_sync", "hybrid", t + 50, t + 52, 0)]
    syncs = [{"rank": 0, "to_version": s + 1, "from_version": s, "step": s, "bytes": 8 << 30,
              "start_ts": 1050.0 + 60 * s, "pause_s": 0.2, "transfer_s": 1.5, "resume_s": 0.3} for s in range(3)]
    batches = [{"step": s, "rank": -1, "trained_version": s, "samples": 256, "lag_min": 0, "lag_mean": 0.5,
                "lag_max": 1, "bound": 1, "dropped": 0, "partial": 3, "ts": 1060.0 + 60 * s} for s in range(3)]
    store_rl.save_report(engine, job, "node-0", Spans.build(*zip(*rows, strict=True)), syncs, batches)


def test_rl_page_shows_phases_idle_and_staleness(store, dashboard_server, browser):
    engine, sim = store
    _fill(engine, sim.job_id)
    browser.get(dashboard_server.url + "rl")

    def timeline():
        fig = figure(browser, "rl-timeline")
        return fig if fig and {t["name"] for t in fig["data"]} >= {"generate", "train_update"} else None

    fig = wait_for(timeline, what="the RL timeline")
    assert {t["name"] for t in fig["data"]} <= set(PHASES)
    summary = wait_for(lambda: "black hole" in (s := text_of(browser, "rl-summary")) and s, what="the summary")
    assert "4 devices" in summary and "bottleneck: rollout" in summary
    bars = figure(browser, "rl-steps")
    tail = next(t for t in bars["data"] if t["name"] == "idle: generation_tail")
    assert tail["y"] == [30.0, 30.0, 30.0]  # three ranks wait 10 s for rank 3 every step
    heat = figure(browser, "rl-heatmap")
    assert len(heat["data"][0]["y"]) == 4
    assert {t["name"] for t in figure(browser, "rl-staleness")["data"]} >= {"lag mean", "bound"}
    assert "GB/s" in {t["name"] for t in figure(browser, "rl-sync")["data"]}
    browser.save_screenshot(str(SCREENSHOTS / "rl.png"))
    assert severe_console_errors(browser) == []
