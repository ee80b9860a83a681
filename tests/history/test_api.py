"""History REST over the live server: JSON and CSV, pagination, views, step ranges, errors,
and large ranges served from a tier once the retention job has rolled them up."""

from __future__ import annotations

import csv
import io
import time

import httpx
import numpy as np

from moeplane.controlplane.retention import Retention, RetentionPolicy
from tests.history.data import EXPERTS, LAYERS, RANKS


def _get(live, path: str, **params) -> httpx.Response:
    return httpx.get(live["base"] + path, params=params, timeout=30)


def test_device_metric_pages_add_up(live):
    t0 = live["t0"]
    args = {"device_id": "n0/gpu0", "metric": "utilization_ratio", "start": t0, "end": t0 + 3600, "bucket_s": 60}
    whole = _get(live, "/api/v1/history/devices", **args).json()
    assert whole["bucket_s"] == 60 and len(whole["items"]) == 60 and whole["next_start"] is None
    assert sum(i["count"] for i in whole["items"]) == np.isfinite(live["data"]["frames"][:360, 0, 0]).sum()
    pages, start = [], t0
    while start is not None:
        page = _get(live, "/api/v1/history/devices", **(args | {"start": start, "limit": 25})).json()
        pages += page["items"]
        start = page["next_start"]
    assert pages == whole["items"]
    r = _get(live, "/api/v1/history/devices", **(args | {"format": "csv", "limit": 25}))
    assert r.headers["content-type"].startswith("text/csv") and r.headers["x-next-start"] == str(t0 + 1500)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 25 and float(rows[3]["mean"]) == whole["items"][3]["mean"]


def test_loads_views_and_steps(live):
    t0, data = live["t0"], live["data"]
    base = {"start": t0, "end": t0 + 600, "bucket_s": 600}
    m = _get(live, "/api/v1/history/jobs/j/loads", **base).json()["items"][0]
    np.testing.assert_allclose(m["values"], data["loads"][:60].mean(axis=0))
    lay = _get(live, "/api/v1/history/jobs/j/loads", **base, view="layer", layer=1, agg="max").json()["items"][0]
    assert lay["values"] == data["loads"][:60, 1].max(axis=0).tolist()
    ex = _get(live, "/api/v1/history/jobs/j/loads", **base, view="expert", expert=5).json()["items"][0]
    assert len(ex["values"]) == LAYERS
    rk = _get(live, "/api/v1/history/jobs/j/loads", **base, view="ranks").json()["items"][0]
    slots = EXPERTS // RANKS
    per_rank = data["loads"][:60].reshape(60, LAYERS, RANKS, slots).sum(axis=(1, 3)).mean(axis=0)
    np.testing.assert_allclose(rk["values"], per_rank)
    csv_rows = _get(live, "/api/v1/history/jobs/j/loads", **base, format="csv").text.splitlines()
    assert csv_rows[0] == "start,steps,index_0,index_1,value" and len(csv_rows) == 1 + LAYERS * EXPERTS
    st = _get(live, "/api/v1/history/jobs/j/steps", step_start=100, step_end=130, bucket_s=3600).json()
    assert sum(i["count"] for i in st["items"]) == 30 * RANKS
    one = st["items"][0]
    assert one["tokens"] > 0 and one["step_time_s_max"] >= one["step_time_s_mean"]
    plans = _get(live, "/api/v1/history/jobs/j/plans").json()
    assert [p["epoch"] for p in plans] == [live["epoch"]] and plans[0]["events"][0]["status"] == "proposed"


def test_errors(live):
    assert _get(live, "/api/v1/history/jobs/nope/loads").status_code == 404
    assert _get(live, "/api/v1/history/jobs/j/loads", view="layer").status_code == 422
    assert _get(live, "/api/v1/history/jobs/j/loads", layer=LAYERS, view="layer").status_code == 422
    r = _get(live, "/api/v1/history/devices", device_id="n0/gpu0", metric="x", start=10, end=5)
    assert r.status_code == 422 and "end" in r.json()["detail"]
    assert _get(live, "/api/v1/history/devices", device_id="nope", metric="x").status_code == 404
    empty = _get(live, "/api/v1/history/jobs/j/steps", step_start=10**9).json()
    assert empty["items"] == []


def test_large_range_comes_from_a_tier(live):
    now = time.time()
    Retention(live["engine"], RetentionPolicy(), lambda: now).run_once()
    r = _get(live, "/api/v1/history/devices", device_id="n0/gpu1", metric="temperature_celsius",
             start=now - 86400, end=now).json()
    assert r["bucket_s"] == 300 and r["source"] == "60s"
    assert r["raw_from"] >= live["t0"] + 2 * 3600  # what was rolled up came from the tier
    assert sum(i["count"] for i in r["items"]) == np.isfinite(live["data"]["frames"][:, 1, 2]).sum()
    hourly = _get(live, "/api/v1/history/jobs/j/loads", start=now - 30 * 86400, end=now, agg="max").json()
    assert hourly["source"] == "3600s" and hourly["bucket_s"] % 3600 == 0
    assert max(np.max(i["values"]) for i in hourly["items"]) == live["data"]["loads"].max()
