from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents.aggregation import RankReport, StepAggregator


def report(rank: int, value: int, ts: float = 0.0) -> RankReport:
    return RankReport(rank, np.full((2, 3), value, dtype=np.int64), 1.0, 0.1, 100, ts)


def test_step_completes_when_every_expected_rank_reported():
    agg = StepAggregator("j", {0, 1}, deadline_s=5)
    assert agg.add(7, report(1, 2, ts=10.0), now=0.0) == []
    (done,) = agg.add(7, report(0, 3, ts=11.0), now=0.1)
    assert (done.step, done.ranks, done.missing_ranks) == (7, (0, 1), ())
    assert (done.counts == 5).all() and done.counts.dtype == np.int64
    assert done.timestamp == 11.0 and [r.rank for r in done.reports] == [0, 1]


def test_missing_rank_is_reported_after_the_deadline_not_waited_for():
    agg = StepAggregator("j", {0, 1, 2}, deadline_s=2)
    agg.add(1, report(0, 1), now=10.0)
    agg.add(2, report(0, 1), now=11.0)
    assert agg.next_deadline() == 12.0
    assert agg.due(11.9) == []
    (done,) = agg.due(12.0)
    assert (done.step, done.ranks, done.missing_ranks) == (1, (0,), (1, 2))
    assert [d.step for d in agg.due(100.0)] == [2]
    assert agg.next_deadline() is None


def test_late_report_after_emission_is_counted_and_dropped():
    agg = StepAggregator("j", {0, 1}, deadline_s=1)
    agg.add(1, report(0, 1), now=0.0)
    agg.due(5.0)
    assert agg.add(1, report(1, 1), now=5.1) == [] and agg.late_reports == 1
    assert agg.open == {}


def test_attached_ranks_become_expected_and_shapes_must_agree():
    agg = StepAggregator("j", deadline_s=1)
    agg.expect(4)
    assert agg.add(0, report(3, 1), now=0) == []  # 3 and 4 are now expected
    with pytest.raises(ValueError, match="counts shape"):
        agg.add(0, RankReport(4, np.zeros((1, 1), np.int64), 1, 0, 1, 0), now=0)
    with pytest.raises(ValueError, match="deadline_s"):
        StepAggregator("j", deadline_s=0)
