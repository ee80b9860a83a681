"""The RL page in headless Chromium: timeline, per-step bars, idle heatmap, tail, staleness and
weight sync of stored spans (written through the store's RL writer, as ingest does); the step-range
picker, its bad inputs, and the device x step timeline of a range with too many spans for bars."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from moeplane.controlplane.rl.phases import PHASES, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.dashboard.rl_callbacks import GANTT_MAX_SPANS
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


def _pick(browser, start: str, end: str, before_click=None) -> None:
    for element_id, text in (("rl-from", start), ("rl-to", end)):
        box = wait_for(lambda i=element_id: browser.find_element(By.ID, i), what=element_id)
        box.send_keys(Keys.CONTROL, "a")  # clear() would not reach React's state
        box.send_keys(Keys.DELETE)
        if text:
            box.send_keys(text)
        wait_for(lambda b=box, v=text: b.get_attribute("value") == v, what=f"{element_id} = {text!r}")
    if before_click is not None:
        before_click()
    click(browser, By.ID, "rl-apply")


def _bars(browser) -> int:
    return sum(len(t.get("y") or []) for t in (figure(browser, "rl-timeline") or {"data": []})["data"]
               if t.get("type") == "bar")


def test_step_range_picker_drives_the_page_and_refuses_bad_ranges(store, dashboard_server, browser):
    engine, sim = store
    _fill(engine, sim.job_id)
    browser.get(dashboard_server.url + "rl")
    wait_for(lambda: _bars(browser) == 48, what="three steps of 4 devices x 4 spans")
    mark_page(browser)
    _pick(browser, "1", "1")
    wait_for(lambda: _bars(browser) == 16, what="the timeline of step 1 alone")
    wait_for(lambda: figure(browser, "rl-steps")["data"][0]["x"] == [1], what="the bars of step 1")
    assert figure(browser, "rl-heatmap")["data"][0]["x"] == [1]
    assert [int(x) for x in figure(browser, "rl-staleness")["data"][0]["x"]] == [1]
    href = browser.find_element(By.ID, "rl-trace-link").get_attribute("href")
    assert href == f"{dashboard_server.url}rl-trace?job={sim.job_id}&step_start=1&step_end=2"
    events = [e for e in httpx.get(href, timeout=10).json()["traceEvents"] if e["ph"] == "X"]
    stored = store_rl.read_spans(engine, sim.job_id, 1, 2)
    assert sorted((e["tid"], e["ts"], e["name"]) for e in events) == sorted(
        (int(r), s * 1e6, PHASES[p]) for r, s, p in zip(stored.rank, stored.start, stored.phase, strict=True))
    assert {e["args"]["step"] for e in events} == {1} and len(events) == 16
    bad = httpx.get(href.replace("step_end=2", "step_end=1"), timeout=10)
    assert bad.status_code == 400 and "step_end: 1 must be above step_start 1" in bad.text
    assert httpx.get(href.replace(f"job={sim.job_id}", "job=nope"), timeout=10).status_code == 404
    assert text_of(browser, "rl-range-status").startswith("steps 1–1")
    # each message differs from the one before it, so each wait sees its own pick answered
    for start, end, message in (("x1", "", "from: not a step number"),
                                ("2", "1", "to: step 1 is before from 2"),
                                ("-3", "", "from: not a step number"),
                                ("0", "20000", "exceeds 10000")):
        _pick(browser, start, end)
        wait_for(lambda m=message: m in text_of(browser, "rl-range-status"), what=message, timeout=20)
        assert text_of(browser, "rl-range-status").startswith("bad step range")
        assert _bars(browser) == 16  # what was shown stays
        assert browser.find_element(By.ID, "rl-trace-link").get_attribute("href") == href
    _pick(browser, "", "")
    wait_for(lambda: _bars(browser) == 48, what="back to the newest steps", timeout=30)
    assert still_same_page(browser)
    assert severe_console_errors(browser) == []


class _HoldOneCall:
    """Wraps ``store_rl.latest_step`` in the server's threads: after :meth:`arm`, the next call
    (the click's) is held until another call has started (a tick's, which Dash sends while the
    click's call is in flight and whose answer supersedes it), or for at most ``seconds``."""

    def __init__(self, read, seconds: float = 10.0):
        self.read, self.seconds = read, seconds
        self.lock = threading.Lock()
        self.armed = False
        self.other = threading.Event()

    def arm(self) -> None:
        with self.lock:
            self.armed = True
            self.other.clear()

    def __call__(self, *args, **kwargs):
        with self.lock:
            hold, self.armed = self.armed, False
            if not hold:
                self.other.set()
        if hold:
            self.other.wait(self.seconds)
        return self.read(*args, **kwargs)


def test_a_click_survives_a_tick_that_lands_while_its_answer_is_in_flight(store, dashboard_server, browser,
                                                                           monkeypatch):
    """The click's call to the picker's callback is held until a tick's call has started: the
    tick's call supersedes it in Dash and must apply the click itself (before the fix, the picks
    here were lost)."""
    from moeplane.dashboard import rl_callbacks

    engine, sim = store
    _fill(engine, sim.job_id)
    gate = _HoldOneCall(rl_callbacks.store_rl.latest_step)
    monkeypatch.setattr(rl_callbacks.store_rl, "latest_step", gate)
    browser.get(dashboard_server.url + "rl")
    wait_for(lambda: _bars(browser) == 48, what="three steps of 4 devices x 4 spans", timeout=30)
    for start, end, bars in (("1", "1", 16), ("0", "1", 32), ("", "", 48)):
        _pick(browser, start, end, before_click=gate.arm)
        wait_for(lambda b=bars: _bars(browser) == b, what=f"steps {start!r}-{end!r}: {bars} bars", timeout=30)


def test_a_range_with_too_many_spans_is_drawn_per_step_and_zooms_to_bars(store, dashboard_server, browser):
    """64 devices x 11 spans x 30 steps (more than GANTT_MAX_SPANS) from step 500: one cell per
    device and step, coloured by the phase with the most time (here the 2.5 s spans tie: the
    lowest code, generate; rank 0 also has a 9 s train_update in step 503); two steps of it: one
    bar per span."""
    engine, sim = store
    devices, per, steps = 64, 11, 30
    assert devices * per * steps > GANTT_MAX_SPANS
    step = np.repeat(np.arange(500, 500 + steps), devices * per)
    rank = np.tile(np.repeat(np.arange(devices), per), steps)
    k = np.tile(np.arange(per), devices * steps)
    start = 5000.0 + (step - 500) * 40.0 + k * 3.0
    end = start + 2.5
    phase = k % len(PHASES)
    end[(step == 503) & (rank == 0) & (phase == PHASES.index("train_update"))] += 6.5
    spans = Spans.build(step, rank, step, phase, np.ones(step.size, dtype=int), start, end,
                        np.zeros(step.size, dtype=int))
    store_rl.save_report(engine, sim.job_id, "node-big", spans)
    browser.get(dashboard_server.url + "rl")
    _pick(browser, "500", "529")

    def heatmap():
        fig = figure(browser, "rl-timeline")
        return fig if fig and fig["data"] and fig["data"][0]["type"] == "heatmap" else None

    fig = wait_for(heatmap, timeout=60, what="the device x step timeline")

    def decoded(v):  # numpy arrays travel base64-encoded; plotly.js keeps the decoded values
        v = v["_inputArray"] if isinstance(v, dict) else v
        return [v[str(i)] for i in range(len(v) - ("length" in v))] if isinstance(v, dict) else v

    trace = fig["data"][0]
    assert decoded(trace["x"]) == list(range(500, 530)) and len(trace["y"]) == devices
    assert "per step" in fig["layout"]["title"]["text"]
    row = trace["y"].index("rollout · rank 0")
    assert [decoded(r) for r in decoded(trace["z"])][row][:4] == [0, 0, 0, PHASES.index("train_update")]
    _pick(browser, "510", "511")
    wait_for(lambda: _bars(browser) == 2 * devices * per, timeout=30, what="bars for two steps")
    assert severe_console_errors(browser) == []
