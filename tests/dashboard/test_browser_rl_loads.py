"""The RL page in headless Chromium: an MoE policy's expert loads during rollout beside those
during training (stored through the store's RL writer, as ingest does), for the newest steps and
for the range applied in the page's step-range picker."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.rl.phases import PHASE_CODE, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store.rl_loads import PhaseLoadsRow
from tests.dashboard.browsing import figure, severe_console_errors
from tests.dashboard.conftest import SCREENSHOTS, wait_for
from tests.dashboard.test_browser_rl import _pick

pytestmark = [pytest.mark.browser, pytest.mark.slow]

L, E = 4, 48  # the conftest's job


def _fill(engine, job: str) -> dict[str, np.ndarray]:
    """Two steps of two ranks: rollout sends 20 % of each layer's tokens to expert 3, training
    spreads them evenly; step 1 routes twice the tokens of step 0. Returns each phase's summed
    counts."""
    rows, sums = [], {"generate": np.zeros((L, E), np.int64), "train_update": np.zeros((L, E), np.int64)}
    for step in range(2):
        for rank in range(2):
            even = np.full((L, E), 100 * (step + 1), np.int64)
            skewed = even.copy()
            skewed[:, 3] = 1175 * (step + 1)  # 1175 / (47 * 100 + 1175) = 0.2
            for phase, counts in (("generate", skewed), ("train_update", even)):
                rows.append(PhaseLoadsRow(step, rank, PHASE_CODE[phase], 2000.0 + step, counts))
                sums[phase] += counts
    store_rl.save_report(engine, job, "node-0", Spans.build([], [], [], [], [], [], [], []), phase_loads=rows)
    return sums


def _routed(browser) -> list[str]:
    """The loads figure's panel titles (phase and tokens routed)."""
    return browser.execute_script("var g=document.querySelector('#rl-loads .js-plotly-plot');"
                                  "return (g.layout.annotations || []).map(a => a.text);")


def test_rl_page_shows_expert_loads_by_phase(store, dashboard_server, browser):
    engine, sim = store
    sums = _fill(engine, sim.job_id)
    browser.get(dashboard_server.url + "rl")

    def heatmaps():
        fig = figure(browser, "rl-loads")
        return fig if fig and [t.get("name") for t in fig["data"]] == ["generate", "train_update"] else None

    fig = wait_for(heatmaps, what="the rollout and training heatmaps")
    generate, train = (np.array(t["z"]) for t in fig["data"])
    assert generate.shape == train.shape == (L, E)
    np.testing.assert_allclose(generate[:, 3], 0.2)
    np.testing.assert_allclose(train, 1 / E)
    balance = figure(browser, "rl-loads-balance")
    by = {t["name"].split(" ")[0]: t["y"] for t in balance["data"]}
    np.testing.assert_allclose(by["generate"], [0.2 * E] * L)  # max / mean = share / (1 / E)
    np.testing.assert_allclose(by["train_update"], [1.0] * L)
    assert _routed(browser) == [f"{p} · {int(sums[p].sum()):,} routed" for p in ("generate", "train_update")]
    assert "steps 0–1" in fig["layout"]["title"]["text"]

    _pick(browser, "1", "1")  # the picker's range: step 1 alone, two thirds of the tokens

    def step_one():
        fig = heatmaps()
        return fig if fig and "steps 1–1" in fig["layout"]["title"]["text"] else None

    fig = wait_for(step_one, what="the loads of step 1 alone")
    assert _routed(browser) == [f"{p} · {int(sums[p].sum()) * 2 // 3:,} routed" for p in ("generate", "train_update")]
    np.testing.assert_allclose(np.array(fig["data"][0]["z"])[:, 3], 0.2)
    browser.execute_script("document.getElementById('rl-loads').scrollIntoView()")
    browser.save_screenshot(str(SCREENSHOTS / "rl-loads.png"))
    assert severe_console_errors(browser) == []
