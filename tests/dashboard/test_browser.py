"""The dashboard in headless Chromium against a real server and a filled SQLite store."""

from __future__ import annotations

import time

import numpy as np
import pytest

from moeplane.controlplane.store import queries as q
from tests.dashboard.browsing import (
    click,
    figure,
    mark_page,
    severe_console_errors,
    still_same_page,
    text_of,
)
from tests.dashboard.conftest import SCREENSHOTS, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

def grid_cell(engine, device_id: str) -> tuple[int, int]:
    from moeplane.dashboard.cluster_views import grid_layout

    return grid_layout(q.list_devices(engine)).positions[device_id]


def test_cluster_page_shows_every_device_and_hot_spots(store, dashboard_server, browser):
    engine, sim = store
    browser.get(dashboard_server.url)
    n_devices = sim.nodes * sim.devices_per_node

    def grid_filled():
        fig = figure(browser, "cluster-grid")
        if not fig:
            return None
        cells = [v for row in fig["data"][0]["z"] for v in row if v is not None]
        return fig if len(cells) == n_devices else None

    fig = wait_for(grid_filled, what="the cluster grid to show every device")
    assert all(30 <= v <= 100 for row in fig["data"][0]["z"] for v in row if v is not None)
    summary = wait_for(lambda: text_of(browser, "cluster-summary"), what="the alert summary")
    assert f"{n_devices} devices, {n_devices} reporting" in summary
    assert "1 unhealthy" in summary and "1 at ≥ 85 °C" in summary

    click(browser, "xpath", "//label[contains(., 'Temperature')]")
    hot_r, hot_c = grid_cell(engine, "node-0/gpu1")

    def hot_spot_outlined():
        f = figure(browser, "cluster-grid")
        return f and "Temperature" in str(f["layout"]["title"]) and list(
            zip(f["data"][1]["y"], f["data"][1]["x"], strict=True)) == [(hot_r, hot_c)]

    wait_for(hot_spot_outlined, what="the planted 91 °C device to be outlined")
    links = figure(browser, "link-graph")
    assert {t["name"] for t in links["data"]} == {"PCIe TX", "PCIe RX", "NVLink TX", "NVLink RX"}
    browser.save_screenshot(str(SCREENSHOTS / "cluster.png"))
    assert severe_console_errors(browser) == []


def test_click_on_a_device_shows_its_history(store, dashboard_server, browser):
    engine, _sim = store
    browser.get(dashboard_server.url)
    r, c = grid_cell(engine, "node-2/gpu5")
    wait_for(lambda: figure(browser, "cluster-grid"), what="the grid")
    # Page coordinates of the cell centre, from plotly's own axis mapping.
    x, y = browser.execute_script(
        "var g=document.querySelector('#cluster-grid .js-plotly-plot'); var L=g._fullLayout;"
        "var b=g.getBoundingClientRect();"
        "return [b.left + L._size.l + L.xaxis.l2p(arguments[1]),"
        "        b.top + L._size.t + L.yaxis.l2p(arguments[0])];", r, c)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    actions = ActionChains(browser)
    builder = ActionBuilder(browser)
    builder.pointer_action.move_to_location(int(x), int(y))
    builder.pointer_action.click()
    builder.perform()
    actions.reset_actions()

    def history_shown():
        f = figure(browser, "device-history")
        return f and "node-2/gpu5" in str(f["layout"]["title"]) and len(f["data"][0]["x"]) >= 6

    wait_for(history_shown, what="node-2/gpu5's history after a click on its cell")


def test_live_sample_updates_grid_without_reload(store, dashboard_server, browser):
    engine, sim = store
    browser.get(dashboard_server.url)
    click(browser, "xpath", "//label[contains(., 'Temperature')]")
    wait_for(lambda: "Temperature" in str((figure(browser, "cluster-grid") or {}).get("layout")),
             what="the temperature grid")
    mark_page(browser)
    r, c = grid_cell(engine, "node-2/gpu3")
    sim.samples(time.time(), overrides={("node-2/gpu3", "temperature_celsius"): 97.5})
    wait_for(lambda: figure(browser, "cluster-grid")["data"][0]["z"][r][c] == 97.5,
             what="the new 97.5 °C sample to appear in the grid")
    f = figure(browser, "cluster-grid")
    assert (r, c) in set(zip(f["data"][1]["y"], f["data"][1]["x"], strict=True))
    assert still_same_page(browser), "the page reloaded"


def test_experts_page_and_live_step(store, dashboard_server, browser):
    engine, sim = store
    browser.get(dashboard_server.url)
    mark_page(browser)
    click(browser, "id", "nav-experts")  # client-side navigation
    latest = q.latest_loads(engine, sim.job_id)
    wait_for(lambda: (figure(browser, "expert-heatmap") or {}).get("data", [{}])[0].get("z")
             == latest["counts"].tolist(), what="the heatmap of the latest step")
    assert wait_for(lambda: text_of(browser, "job-select")) == sim.job_id
    ranks = figure(browser, "rank-load")["data"][0]["z"]
    assert len(ranks) == sim.layers and len(ranks[0]) == sim.nodes * sim.devices_per_node
    bal = figure(browser, "balancedness-graph")["data"]
    assert bal[0]["x"][-1] == latest["step"] and all(v >= 1.0 for v in bal[0]["y"])
    assert len(figure(browser, "placement-graph")["data"][0]["text"]) == sim.nodes * sim.devices_per_node
    browser.save_screenshot(str(SCREENSHOTS / "experts.png"))

    step = latest["step"] + 1
    counts = sim.step(step, time.time())
    wait_for(lambda: f"step {step}" in text_of(browser, "experts-status"), what=f"step {step}")
    wait_for(lambda: figure(browser, "expert-heatmap")["data"][0]["z"] == counts.tolist(),
             what="the new step's counts in the heatmap")
    wait_for(lambda: figure(browser, "balancedness-graph")["data"][0]["x"][-1] == step,
             what="the new step in the balancedness view")
    assert still_same_page(browser), "the page reloaded"
    assert severe_console_errors(browser) == []


def test_history_page_sums_a_step_range(store, dashboard_server, browser):
    engine, sim = store
    browser.get(dashboard_server.url + "history")
    wait_for(lambda: figure(browser, "history-heatmap"), what="the history page")
    browser.find_element("id", "history-from").send_keys("1")
    browser.find_element("id", "history-to").send_keys("3")
    click(browser, "id", "history-apply")
    rows = q.loads_history(engine, sim.job_id, q.Range(step_start=1, step_end=4))
    want = np.sum([r["counts"] for r in rows], axis=0).tolist()
    wait_for(lambda: figure(browser, "history-heatmap")["data"][0]["z"] == want,
             what="steps 1-3 summed in the history heatmap")
    assert "steps 1–3" in text_of(browser, "history-status")
    assert figure(browser, "history-balancedness")["data"][0]["x"] == [1, 2, 3]
    assert figure(browser, "history-steptime")["data"][0]["x"] == [1, 2, 3]

    # the cluster grid as it was at step 3, not as it is now (later samples were written since)
    at = rows[-1]["ts"]
    r, c = grid_cell(engine, "node-2/gpu3")
    then = q.device_history(engine, "node-2/gpu3", "utilization_ratio", q.Range(start=at, end=at + 0.5))
    assert len(then) == 1
    wait_for(lambda: (figure(browser, "history-cluster-grid") or {}).get("data")
             and figure(browser, "history-cluster-grid")["data"][0]["z"][r][c] == round(then[0]["value"] * 100, 3),
             what="node-2/gpu3's utilization at step 3 in the history grid")
    grid = figure(browser, "history-cluster-grid")
    cells = [v for row in grid["data"][0]["z"] for v in row if v is not None]
    assert len(cells) == sim.nodes * sim.devices_per_node
    assert "as of" in text_of(browser, "history-cluster-summary")
    browser.save_screenshot(str(SCREENSHOTS / "history.png"))
    assert severe_console_errors(browser) == []
