"""Pure tier statistics: equal to numpy on the raw values; combining rows is exact for count,
mean and max; the combined p95 has at most 5 % + K values above it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeplane.controlplane.retention import RetentionPolicy
from moeplane.controlplane.store import tiers
from moeplane.controlplane.store.history import plan_window


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=60), st.integers(1, 5))
@settings(max_examples=50, deadline=None)
def test_combining_rows_matches_the_union(values, parts):
    x = np.asarray(values)
    cuts = np.array_split(x, min(parts, len(x)))
    combined = tiers.combine_stats(np.stack([tiers.cell_stats(c) for c in cuts]))
    whole = tiers.cell_stats(x)
    assert combined[0] == whole[0]
    assert combined[1] == pytest.approx(whole[1], rel=1e-9, abs=1e-6)
    assert combined[2] == whole[2]
    # p95 of K rows: at most 5 % + K of the values lie above it
    assert (x > combined[3]).sum() <= 0.05 * len(x) + len(cuts)


def test_cell_stats_nan_is_not_measured():
    x = np.array([[1.0, np.nan], [3.0, np.nan], [np.nan, np.nan]])
    s = tiers.cell_stats(x)
    assert s[:, 0].tolist() == [2, 2, 3, np.percentile([1, 3], 95)]
    assert s[0, 1] == 0 and np.isnan(s[1:, 1]).all()
    with pytest.raises(ValueError, match="values"):
        tiers.cell_stats(np.empty((0, 2)))


def test_rank_stats_and_combination():
    rank = np.array([0, 1, 0, 1, 0])
    st_ = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    hb = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    tok = np.array([10, 20, 30, 40, 50])
    whole = tiers.rank_step_stats(rank, st_, hb, tok, 3)
    assert whole[0].tolist()[:3] == [3, 3.0, 5.0] and whole[0, 7] == 90 and whole[2, 0] == 0
    parts = np.stack([tiers.rank_step_stats(rank[:2], st_[:2], hb[:2], tok[:2], 3),
                      tiers.rank_step_stats(rank[2:], st_[2:], hb[2:], tok[2:], 3)])
    comb = tiers.combine_rank_stats(parts)
    np.testing.assert_allclose(comb[:, [0, 1, 2, 4, 5, 7]], whole[:, [0, 1, 2, 4, 5, 7]])


def test_plan_window_picks_the_coarsest_fitting_tier():
    pol = RetentionPolicy(raw_s=2 * 86400, minute_s=7 * 86400, hour_s=0)
    now = 1_000_000_000.0
    w = plan_window(now - 86400, now, None, 10_000, now, pol)  # a day / 500 → 300 s buckets
    assert (w.bucket_s, w.source) == (300, 60)
    assert plan_window(now - 600, now, 30, 100, now, pol).source == 0
    assert plan_window(now - 86400 * 3, now, 7200, 100, now, pol).source == 3600
    old = plan_window(now - 86400 * 10, now - 86400 * 9, 60, 100, now, pol)  # minute tier expired
    assert (old.source, old.bucket_s) == (3600, 3600)
    page = plan_window(now - 3600, now, 60, 10, now, pol)
    assert page.end - page.start == 600 and page.next_start == page.end
    with pytest.raises(ValueError, match="end"):
        plan_window(now, now, 60, 10, now, pol)
    with pytest.raises(ValueError, match="raw_s"):
        RetentionPolicy(raw_s=60)
