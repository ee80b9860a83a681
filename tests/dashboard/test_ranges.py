import pytest

from moeplane.dashboard.ranges import HISTORY_STEPS, MAX_HISTORY_STEPS, history_range


def test_blank_inputs_mean_the_last_steps():
    r = history_range("steps", "", None, 100)
    assert (r.step_start, r.step_end) == (100 - HISTORY_STEPS + 1, 101)
    assert r.limit == MAX_HISTORY_STEPS


def test_step_range_is_inclusive():
    r = history_range("steps", "3", " 7 ", 100)
    assert (r.step_start, r.step_end) == (3, 8)


def test_time_range_defaults_to_utc():
    r = history_range("time", "1970-01-01T00:01:00", "1970-01-01 00:02:00+00:00", None)
    assert (r.start, r.end) == (60.0, 120.0)


@pytest.mark.parametrize(
    ("kind", "start", "end", "name"),
    [
        ("steps", "x", "", "from"),
        ("steps", "5", "3", "to"),
        ("time", "yesterday", "", "from"),
        ("time", "1970-01-02", "1970-01-01", "to"),
        ("days", "", "", "kind"),
    ],
)
def test_bad_input_names_the_field(kind, start, end, name):
    with pytest.raises(ValueError, match=name):
        history_range(kind, start, end, 10)
