"""Queries across tiers on SQLite and PostgreSQL: after the retention job rolls data up, and
after raw data is deleted, every answer equals the one computed from raw data before."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.retention import Retention, RetentionPolicy
from moeplane.controlplane.store import history as H
from moeplane.controlplane.store import load_history as LH
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from tests.history.data import EXPERTS, LAYERS, RANKS, fill

T0 = 1_700_002_800.0  # a whole hour
SPAN = 3 * 3600.0
POLICY = RetentionPolicy(raw_s=3720.0, loads_s=3720.0, minute_s=7 * 86400.0, hour_s=0.0, lag_s=120.0)
KEEP = RetentionPolicy(raw_s=5 * 3600.0, loads_s=5 * 3600.0, minute_s=7 * 86400.0, hour_s=0.0, lag_s=120.0)


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(database_url):
    upgrade(database_url)
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def _queries(engine, now):
    """Every query shape under test, for the first two hours (rolled up, later deleted)."""
    out = {}
    for bucket in (60, 120, 3600):
        win = H.plan_window(T0, T0 + 7200, bucket, 1000, now, POLICY)
        out[("metric", bucket)] = (win, H.device_metric(engine, "n0/gpu1", "temperature_celsius", win))
        out[("steps", bucket)] = (win, H.step_stats(engine, "j", win))
        for agg in ("mean", "max", "p95"):
            out[("loads", bucket, agg)] = (win, LH.load_history(engine, "j", win, agg=agg))
        out[("expert", bucket)] = (win, LH.load_history(engine, "j", win, view="expert", expert=3, layer=1))
    return out


def _same(a: dict, b: dict, key: tuple) -> None:
    """Equal, except p95 where a bucket spans several tier rows (approximate by design)."""
    exact_p95 = key[1] in (60, 3600)
    assert len(a["items"]) == len(b["items"]) > 0
    for x, y in zip(a["items"], b["items"], strict=True):
        for k, v in x.items():
            if ("p95" in k or (k == "values" and "p95" in key)) and not exact_p95:
                continue
            if isinstance(v, list | float):
                np.testing.assert_allclose(np.asarray(y[k], dtype=float), np.asarray(v, dtype=float), rtol=1e-6)
            else:
                assert y[k] == v, k


def test_tiers_equal_raw_and_survive_raw_deletion(engine):
    data = fill(engine, T0, SPAN)
    clock = Clock(T0 + SPAN + 200)
    raw = _queries(engine, clock.now)
    assert all(r[1]["source"] in ("60s", "3600s") for r in raw.values())  # chosen, but not rolled up yet
    done = Retention(engine, KEEP, clock).run_once()
    assert done["rollup_samples_60"] > 0 and done["rollup_loads_3600"] == 3 * 1  # 3 whole hours, one job
    assert done["deleted_samples"] == 0  # still inside the raw window
    tiered = _queries(engine, clock.now)
    for key in raw:
        _same(raw[key][1], tiered[key][1], key)
    # the raw values themselves, by hand, for the 1-hour buckets
    hour = tiered[("loads", 3600, "max")][1]["items"][1]
    sel = (data["ts"] >= T0 + 3600) & (data["ts"] < T0 + 7200)
    np.testing.assert_array_equal(hour["values"], data["loads"][sel].max(axis=0))
    temp = data["frames"][sel][:, 1, 2].astype(np.float64)
    point = tiered[("metric", 3600)][1]["items"][1]
    assert point["count"] == np.isfinite(temp).sum()
    assert point["mean"] == pytest.approx(np.nanmean(temp), rel=1e-6)
    assert point["p95"] == pytest.approx(np.nanpercentile(temp, 95), rel=1e-6)

    # later: raw older than the window is deleted, tiers still answer the same
    clock.now = T0 + 7200 + POLICY.raw_s + 500  # raw before T0 + 7700 expires
    frames_before = q.count_rows(engine, "sample_frames")
    done = Retention(engine, POLICY, clock).run_once()
    assert done["deleted_samples"] > 0 and done["deleted_loads"] > 0 and done["deleted_steps"] > 0
    assert q.count_rows(engine, "sample_frames") == frames_before - done["deleted_samples"]
    with engine.connect() as conn:
        oldest = conn.execute(sa.select(sa.func.min(t.sample_frames.c.ts))).scalar()
        assert oldest >= clock.now - POLICY.raw_s
        # the dedup claims go too, except each node's newest seq (its resume point)
        assert conn.execute(sa.select(sa.func.max(t.received.c.seq))).scalar() == 3 * len(data["ts"])
    assert done["deleted_received"] > 0
    after = _queries(engine, clock.now)
    for key in raw:
        _same(raw[key][1], after[key][1], key)


def test_nothing_is_deleted_before_it_is_rolled_up(engine):
    fill(engine, T0, 1800)
    policy = RetentionPolicy(raw_s=3720.0, loads_s=3720.0, lag_s=120.0)
    # the job has never run; much later the first pass must roll up before deleting
    Retention(engine, policy, Clock(T0 + 86400)).run_once()
    assert q.count_rows(engine, "sample_frames") == 0
    win = H.plan_window(T0, T0 + 1800, 60, 100, T0 + 86400, policy)
    assert win.source == 60
    assert len(H.device_metric(engine, "n0/gpu0", "utilization_ratio", win)["items"]) == 30


def test_rank_loads_follow_the_applied_placement(engine):
    data = fill(engine, T0, 600)  # 60 steps, 10 s apart
    world, slots = RANKS, EXPERTS // RANKS
    moved = identity_placement(LAYERS, EXPERTS, world * (slots))[:, ::-1].copy()  # every expert on the other rank
    epoch = P.create_plan(engine, "j", moved, world_size=world, slots_per_rank=slots, status=Status.APPLIED)
    with engine.begin() as conn:
        conn.execute(sa.update(t.plans).where(t.plans.c.epoch == epoch).values(applied_step=30))
    win = H.plan_window(T0, T0 + 600, 10, 100, T0 + 700, POLICY)
    items = LH.load_history(engine, "j", win, view="ranks", agg="max")["items"]
    assert len(items) == 60 and {i["steps"] for i in items} == {1}
    for it in items:
        counts = data["loads"][it["step_first"]]
        own = counts[:, :slots].sum(), counts[:, slots:].sum()  # identity: rank 0 holds experts 0..S-1
        expected = own if it["step_first"] < 30 else own[::-1]
        assert it["values"] == list(map(float, expected))
    one = LH.load_history(engine, "j", win, view="ranks", layer=2)["items"][0]
    assert one["values"] == [float(data["loads"][0][2, :slots].sum()), float(data["loads"][0][2, slots:].sum())]


def test_step_ranges_and_validation(engine):
    data = fill(engine, T0, 600)
    span = H.steps_to_time(engine, "j", 10, 20)
    assert span == (pytest.approx(data["ts"][10]), pytest.approx(data["ts"][19] + 1.0))
    win = H.plan_window(*span, 60, 100, T0 + 700, POLICY)
    steps = H.step_stats(engine, "j", win, rank=1, steps=(10, 20))["items"]
    assert sum(i["count"] for i in steps) == 10 and {i["rank"] for i in steps} == {1}
    loads = LH.load_history(engine, "j", win, steps=(10, 20))["items"]
    assert sum(i["steps"] for i in loads) == 10 and loads[0]["step_first"] == 10
    assert H.steps_to_time(engine, "j", 10_000, None) is None
    with pytest.raises(ValueError, match="layer"):
        LH.load_history(engine, "j", win, view="layer")
    with pytest.raises(ValueError, match="expert"):
        LH.load_history(engine, "j", win, view="expert", expert=EXPERTS)
    with pytest.raises(q.NotFound):
        H.device_metric(engine, "n0/gpu0", "no_such_metric", win)
    with pytest.raises(q.NotFound):
        H.step_stats(engine, "other", win)
