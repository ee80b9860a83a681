"""The step range an RL view reads (REST and the RL page's picker share the rule)."""

from __future__ import annotations

import pytest

from moeplane.controlplane.rl.step_window import newest_within, step_window
from moeplane.dashboard.rl_callbacks import STEPS, picked_range


def test_defaults_and_bounds():
    assert step_window(None, None, None) == (0, 1)
    assert step_window(None, None, 99, default=20) == (80, 100)
    assert step_window(5, None, 99, default=20) == (5, 25)
    assert step_window(None, 10, 99, default=20) == (0, 10)
    assert step_window(3, 4, None) == (3, 4)


@pytest.mark.parametrize(("start", "end", "message"), [
    (5, 5, "step_end: 5 must be above step_start 5"),
    (-1, None, "step_start: -1 is negative"),
    (0, 10_001, "step_end: a range of 10001 steps exceeds 10000"),
])
def test_bad_ranges_name_the_bound(start, end, message):
    with pytest.raises(ValueError, match=message):
        step_window(start, end, 100)


def test_newest_within_keeps_the_newest_steps_under_the_limit():
    assert newest_within([], [], 10) is None
    assert newest_within([1, 2, 3, 4], [5, 5, 5, 5], 10) == 3
    assert newest_within([1, 2, 3, 4], [5, 5, 5, 5], 100) == 1
    assert newest_within([1, 2], [5, 50], 10) == 2  # the newest step alone, even over the limit


def test_the_picker_is_inclusive_and_names_the_bad_box():
    assert picked_range("3", "3", 9) == (3, 4)
    assert picked_range(" ", "", 99) == (100 - STEPS, 100)
    assert picked_range("7", "", 99) == (7, 7 + STEPS)
    for start, end, message in (("4", "2", "to: step 2 is before from 4"), ("a", "", "from: not a step number"),
                                ("", "-1", "to: not a step number"), ("0", "10000", "exceeds 10000")):
        with pytest.raises(ValueError, match=message):
            picked_range(start, end, 5)
