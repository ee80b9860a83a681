"""The binned timeline is exact: per device, bin and phase, the seconds equal the spans'
durations clipped to the bin, checked against a span-by-span reference, on random spans and
on spans stored in and read back from the store (SQLite)."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.rl import timeline_bins as tb
from moeplane.controlplane.rl.phases import PHASES, Spans


def _reference(device, phase, start, end, grid: tb.Grid, devices: int) -> np.ndarray:
    """One span and one bin at a time: overlap of [start, end) with each bin."""
    out = np.zeros((devices, grid.bins, len(PHASES)))
    edges = grid.edges()
    for d, p, s, e in zip(device.tolist(), phase.tolist(), start.tolist(), end.tolist(), strict=True):
        for b in range(grid.bins):
            out[d, b, p] += max(0.0, min(e, edges[b + 1]) - max(s, edges[b]))
    return out


def _random_spans(rng, n: int, devices: int):
    start = 1e9 + rng.uniform(0, 100, n)
    length = np.where(rng.random(n) < 0.2, rng.uniform(10, 60, n), rng.uniform(0, 2, n))  # some cross many bins
    return (rng.integers(0, devices, n), rng.integers(0, len(PHASES), n), start, start + length)


def test_bins_equal_clipped_durations():
    rng = np.random.default_rng(7)
    dev, ph, s, e = _random_spans(rng, 400, 5)
    grid = tb.Grid(1e9 + 10.0, 3.5, 25)  # starts inside the spans: parts before t0 and after t1 drop
    got = tb.bin_spans(dev, ph, s, e, grid, devices=5)
    assert got.shape == (5, 25, len(PHASES))
    np.testing.assert_allclose(got, _reference(dev, ph, s, e, grid, 5), rtol=0, atol=1e-9)


def test_grid_over_keeps_every_second_and_edges_fall_in_one_bin():
    rng = np.random.default_rng(3)
    dev, ph, s, e = _random_spans(rng, 300, 4)
    grid = tb.grid_over(s, e, 40)
    got = tb.bin_spans(dev, ph, s, e, grid, devices=4)
    np.testing.assert_allclose(got.sum(), (e - s).sum(), rtol=1e-12)
    # a span that ends exactly on a bin edge puts nothing into the next bin
    edge = tb.Grid(0.0, 1.0, 4)
    one = tb.bin_spans(np.array([0]), np.array([2]), np.array([0.5]), np.array([2.0]), edge, devices=1)
    assert one[0, :, 2].tolist() == [0.5, 1.0, 0.0, 0.0]


def test_dominant_phase_and_empty_cells():
    sec = np.zeros((2, 3, len(PHASES)))
    sec[0, 0, 6], sec[0, 0, 0], sec[1, 2, 7] = 2.0, 1.0, 0.5
    assert tb.dominant(sec).tolist() == [[6, -1, -1], [-1, -1, 7]]


def test_bad_bins_are_refused():
    with pytest.raises(ValueError, match="bins"):
        tb.grid_over(np.array([0.0]), np.array([1.0]), 0)


def test_stored_spans_bin_exactly(tmp_path):
    from moeplane.controlplane.store import rl as store_rl
    from moeplane.controlplane.store import rl_columns
    from moeplane.controlplane.store.engine import make_engine
    from moeplane.controlplane.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'rl.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    rng = np.random.default_rng(11)
    n = 600
    step = rng.integers(0, 6, n)
    rank = rng.integers(0, 8, n)
    start = 1e9 + step * 30.0 + rng.uniform(0, 25, n)
    end = start + rng.uniform(0, 12, n)
    spans = Spans.build(step, rank, step, rng.integers(0, len(PHASES), n), np.zeros(n, dtype=int), start, end,
                        np.zeros(n, dtype=int))
    store_rl.save_report(engine, "job", "node-0", spans)
    cols = rl_columns.read_timeline_columns(engine, "job", 1, 5)
    grid = tb.grid_over(cols.start, cols.end, 50)
    got = tb.bin_spans(cols.device, cols.phase, cols.start, cols.end, grid, devices=cols.ranks.size)
    stored = store_rl.read_spans(engine, "job", 1, 5)  # the same spans through the row reader
    device = np.searchsorted(cols.ranks, stored.rank)
    want = _reference(device, stored.phase, stored.start, stored.end, grid, cols.ranks.size)
    assert len(stored) == cols.phase.size > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    engine.dispose()
