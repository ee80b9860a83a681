"""Plans and Memory pages in headless Chromium against the real control plane
(``moeplane.controlplane.server.serve`` with the dashboard mounted, in-process bus): approving a plan on
the page runs the REST approve handler on the server's loop, changes the plan's status in the
store and publishes the PlacementPlan on the bus."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from harness.simjob import SimJob
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array
from tests import aio
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A real server on a filled SQLite store: a manual-policy job whose controller never
    proposes by itself, plan 1 applied at step 3, plan 2 proposed, memory profiles."""
    from tests.controlplane.serverthread import running_server

    url = f"sqlite:///{tmp_path_factory.mktemp('plans') / 'store.sqlite'}"
    upgrade(url)
    with running_server(url, dashboard=True) as info:
        engine = info["engine"]
        sim = SimJob(StoreWriter(engine), nodes=2, devices_per_node=4, layers=4, experts=8)
        t0 = time.time() - 30
        sim.hello(t0)
        P.set_policy(engine, sim.job_id, {"mode": "manual", "imbalance_threshold": 1e6})
        for step in range(6):
            sim.samples(t0 + step)
            sim.step(step, t0 + step)
        running = (sim.identity() + 1) % sim.experts
        first = sim.plan(running, predicted_before=1.6, predicted_after=1.2, measured_before=1.58,
                         moves=8, cross_node_moves=4)
        sim.apply(first, step=3)
        proposed = running.copy()
        proposed[2, [0, 5]] = proposed[2, [5, 0]]  # layer 2: ranks 0 and 5 swap their experts
        second = sim.plan(proposed, predicted_before=1.3, predicted_after=1.05, measured_before=1.31,
                          moves=2, cross_node_moves=2, reason="layer 2 imbalanced")
        sim.memory(t0 + 6, step=5)
        yield info, sim, first, second, proposed


def dashboard_url(info) -> str:
    return f"http://127.0.0.1:{info['http_port']}/dashboard/"


def test_plans_page_shows_timeline_moves_and_diff(cluster, browser):
    info, sim, first, second, _proposed = cluster
    browser.get(dashboard_url(info) + "plans")
    wait_for(lambda: f"plan-row-{second}" in browser.page_source, what="the plans table")
    row = text_of(browser, f"plan-row-{second}")
    assert "proposed" in row and "0 intra / 2 cross" in row and "1.300 → 1.050" in row
    assert "1.310 → –" in row
    assert "applied" in text_of(browser, f"plan-row-{first}")
    status = text_of(browser, "plans-status")
    assert "policy manual" in status and f"running placement: epoch {first}" in status
    tl = wait_for(lambda: figure(browser, "plans-timeline"), what="the timeline")
    by_name = {t["name"]: t for t in tl["data"]}
    assert by_name["predicted after"]["y"] == [1.2, 1.05]
    assert by_name["status"]["customdata"] == ["applied", "proposed"]
    summary = wait_for(lambda: text_of(browser, "plan-diff-summary") if "slots change" in
                       text_of(browser, "plan-diff-summary") else None, what="the diff of the proposed plan")
    assert f"plan {second} (proposed)" in summary and f"(epoch {first})" in summary
    assert "2 slots change in 1 layers" in summary and "0 (layer, expert) pairs gain" in summary
    diff = figure(browser, "plan-diff-graph")
    assert np.count_nonzero(diff["data"][1]["z"]) == 2  # ranks 0 and 5 of layer 2
    slots = text_of(browser, "plan-diff-slots")
    assert "True" in slots  # rank 0 (node 0) takes an expert held only on node 1
    browser.save_screenshot(str(SCREENSHOTS / "plans.png"))
    assert severe_console_errors(browser) == []


def test_approving_a_plan_on_the_page_pushes_it(cluster, browser):
    info, sim, _first, second, proposed = cluster
    engine, bus = info["engine"], info["bus"]
    sub = aio.run(bus.subscribe(f"plans.{sim.job_id}"))
    received = asyncio.run_coroutine_threadsafe(anext(aiter(sub)), aio.loop())
    try:
        browser.get(dashboard_url(info) + "plans")
        mark_page(browser)
        click(browser, "xpath", f"//tr[@id='plan-row-{second}']//button[text()='Approve']")
        wait_for(lambda: P.get_plan(engine, sim.job_id, second, with_placement=False)["status"] == "pushed",
                 what="the plan to be approved and pushed in the store")
        channel, payload = received.result(15)
    finally:
        aio.run(sub.close())
    msg = pb.PlacementPlan.FromString(payload)
    assert channel == f"plans.{sim.job_id}" and msg.epoch == second
    assert np.array_equal(decode_array(msg.phy2log, "phy2log", kinds="iu"), proposed)
    events = [e["status"] for e in P.plan_events(engine, sim.job_id, second)]
    assert events[-2:] == ["approved", "pushed"]
    assert any(e["detail"] == "approved by operator" for e in P.plan_events(engine, sim.job_id, second))
    wait_for(lambda: "pushed" in text_of(browser, f"plan-row-{second}"), what="the table to show 'pushed'")
    assert f"plan {second}: approved, now pushed" in text_of(browser, "plan-action-result")
    assert not browser.find_elements("xpath", f"//tr[@id='plan-row-{second}']//button")
    assert still_same_page(browser), "the page reloaded"
    browser.save_screenshot(str(SCREENSHOTS / "plans-approved.png"))


def test_rejecting_a_plan_on_the_page(cluster, browser):
    info, sim, _first, _second, proposed = cluster
    engine = info["engine"]
    third = sim.plan(proposed, reason="another proposal")
    browser.get(dashboard_url(info) + "plans")
    click(browser, "xpath", f"//tr[@id='plan-row-{third}']//button[text()='Reject']")
    wait_for(lambda: P.get_plan(engine, sim.job_id, third, with_placement=False)["status"] == "rejected",
             what="the plan to be rejected in the store")
    wait_for(lambda: "rejected" in text_of(browser, f"plan-row-{third}"), what="the table to show 'rejected'")


def test_memory_page_shows_breakdown_and_decisions(cluster, browser):
    info, sim, *_ = cluster
    browser.get(dashboard_url(info))
    mark_page(browser)
    click(browser, "id", "nav-memory")
    fig = wait_for(lambda: figure(browser, "memory-breakdown") if (figure(browser, "memory-breakdown") or
                   {}).get("data") else None, what="the memory breakdown")
    names = [t["name"] for t in fig["data"]]
    assert names[:5] == ["parameters", "gradients", "optimizer state", "activations (peak)",
                         "other (workspace, cache)"]
    assert len(fig["data"][0]["x"]) == sim.nodes * sim.devices_per_node
    assert fig["data"][3]["y"][0] == 34.0  # node-0/gpu0's peak activations, GiB
    status = text_of(browser, "memory-status")
    assert "1 above the high watermark" in status and "1 with an open decision" in status
    table = text_of(browser, "offload-table")
    assert "node-0/gpu0" in table and "swap_activations: layer.3, layer.4" in table and "proposed" in table
    assert still_same_page(browser)
    browser.save_screenshot(str(SCREENSHOTS / "memory.png"))
    assert severe_console_errors(browser) == []
