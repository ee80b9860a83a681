"""The idle ("black hole") analysis on hand-built spans whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.rl import idle
from moeplane.controlplane.rl import intervals as iv
from moeplane.controlplane.rl.phases import Spans


def _spans(rows):
    """rows: (step, rank, role, phase, start, end)."""
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    return Spans.build(cols[0], cols[1], [0] * n, cols[3], cols[2], cols[4], cols[5], [0] * n)


def test_union_merges_overlaps_and_clips():
    s, e = iv.union(np.array([3.0, 0.0, 1.0, 8.0]), np.array([4.0, 2.0, 2.5, 12.0]), 0.0, 10.0)
    assert s.tolist() == [0.0, 3.0, 8.0] and e.tolist() == [2.5, 4.0, 10.0]
    assert iv.length((s, e)) == pytest.approx(5.5)


def test_colocated_step_tail_refit_and_switch():
    # two hybrid devices: rank 0 generates 0-4, rank 1 generates 0-10 (the long tail);
    # both onload/offload 10-11, weight sync 11-12 on rank 1 only, both train 12-20
    rows = [
        (0, 0, "hybrid", "generate", 0, 4), (0, 1, "hybrid", "generate", 0, 10),
        (0, 0, "hybrid", "offload", 10, 11), (0, 1, "hybrid", "offload", 10, 11),
        (0, 1, "hybrid", "weight_sync", 11, 12),
        (0, 0, "hybrid", "train_update", 12, 20), (0, 1, "hybrid", "train_update", 12, 20),
    ]
    rep = idle.analyze(_spans(rows))
    assert rep.wall.tolist() == [20.0]
    np.testing.assert_allclose(rep.productive[0], [12.0, 18.0])
    np.testing.assert_allclose(rep.switch[0], [1.0, 1.0])
    np.testing.assert_allclose(rep.sync[0], [0.0, 1.0])
    np.testing.assert_allclose(rep.idle[0], [7.0, 0.0])
    causes = dict(zip(idle.CAUSES, rep.idle_cause[0, 0], strict=True))
    assert causes["generation_tail"] == pytest.approx(6.0)  # 4-10: rank 1 still generating
    assert causes["refit_bubble"] == pytest.approx(1.0)  # 11-12: rank 1 syncing
    # every instant of wall time is in exactly one category
    total = rep.productive + rep.sync + rep.switch + rep.idle
    np.testing.assert_allclose(total, rep.wall[:, None] * rep.present)
    np.testing.assert_allclose(rep.idle_cause.sum(axis=2), rep.idle)
    s = rep.summary()
    assert s["black_hole_fraction"] == pytest.approx(7.0 / 40.0)
    assert s["tail_ratio"] == pytest.approx(10.0 / 7.0)  # max 10 / median of (4, 10)
    assert s["sync_share"] == pytest.approx(1.0 / 40.0)
    assert rep.bottleneck.tolist() == [idle.BOTTLENECKS.index("rollout")]  # 10 s gen vs 8 s train


def test_disaggregated_starvation_and_throttle():
    # rank 0 rollout generates 0-6 then waits (staleness bound) 6-10; rank 1 trainer waits for
    # samples 0-6, trains 6-10
    rows = [
        (3, 0, "rollout", "generate", 100, 106), (3, 0, "rollout", "wait", 106, 110),
        (3, 1, "trainer", "train_update", 106, 110),
    ]
    rep = idle.analyze(_spans(rows))
    c = {name: rep.idle_cause[0, :, i].tolist() for i, name in enumerate(idle.CAUSES)}
    assert c["starvation"] == [0.0, 6.0]
    assert c["staleness_throttle"] == [4.0, 0.0]
    assert rep.idle[0].tolist() == [4.0, 6.0]
    assert rep.bottleneck.tolist() == [idle.BOTTLENECKS.index("rollout")]


def test_job_level_timers_are_not_devices():
    rows = [(0, -1, "hybrid", "generate", 0, 5), (0, 0, "hybrid", "generate", 0, 5)]
    rep = idle.analyze(_spans(rows))
    assert rep.ranks.tolist() == [0] and rep.idle.tolist() == [[0.0]]


def test_empty_input():
    rep = idle.analyze(_spans([(0, 0, "hybrid", "generate", 0, 1)]).take(np.zeros(1, dtype=bool)))
    assert rep.steps.size == 0 and rep.summary()["black_hole_fraction"] == 0.0


def test_black_hole_alert_needs_n_steps_in_a_row_above_the_threshold():
    f = np.array([0.5, 0.1, 0.4, 0.5, 0.6])
    assert idle.black_hole_alert(f, 0.3, 3) and not idle.black_hole_alert(f, 0.3, 4)
    assert not idle.black_hole_alert(f[:2], 0.05, 3)  # too few steps yet
    with pytest.raises(ValueError, match="steps"):
        idle.black_hole_alert(f, 0.3, 0)
    rep = idle.analyze(_spans([(0, 0, "hybrid", "generate", 0, 4), (0, 1, "hybrid", "generate", 0, 10)]))
    np.testing.assert_allclose(idle.step_black_hole_fractions(rep), [6.0 / 20.0])
