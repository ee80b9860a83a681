"""Per-step phase seconds kept at ingest (``rl_step_phases``), on SQLite and PostgreSQL: every
(step, rank, phase) sum equals the stored spans' durations, reports resent whole or in part are
not counted twice, two nodes add up, and the 0009 migration summarizes spans stored before it."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl.phases import PHASES, Spans
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store import rl_steps
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade


def _spans(rng, n: int, rank_lo: int, rank_hi: int, t: float = 1000.0) -> Spans:
    step = rng.integers(0, 6, n)
    start = t + step * 50.0 + rng.uniform(0, 40, n)
    return Spans.build(step, rng.integers(rank_lo, rank_hi, n), step, rng.integers(0, len(PHASES), n),
                       rng.integers(0, 3, n), start, start + rng.exponential(3.0, n), np.zeros(n, dtype=int))


def _reference(stored: Spans) -> sp.StepGrid:
    """One span at a time, from what the spans table holds."""
    steps, ranks = np.unique(stored.step), np.unique(stored.rank)
    seconds = np.zeros((steps.size, ranks.size, len(PHASES)))
    present = np.zeros((steps.size, ranks.size), dtype=bool)
    for s, r, p, a, b in zip(stored.step, stored.rank, stored.phase, stored.start, stored.end, strict=True):
        d, k = np.searchsorted(ranks, r), np.searchsorted(steps, s)
        seconds[k, d, p] += b - a
        present[k, d] = True
    wall = np.array([stored.end[stored.step == s].max() - stored.start[stored.step == s].min() for s in steps])
    return sp.StepGrid(steps, ranks.astype(np.int32), np.zeros(0), seconds, present, wall, len(stored))


def _check(engine, job: str, lo: int = 0, hi: int = 100) -> sp.StepGrid:
    got = sp.grid(*rl_steps.read(engine, job, lo, hi))
    want = _reference(store_rl.read_spans(engine, job, lo, hi))
    assert got.steps.tolist() == want.steps.tolist() and got.ranks.tolist() == want.ranks.tolist()
    np.testing.assert_allclose(got.seconds, want.seconds, rtol=1e-12, atol=1e-9)
    assert (got.present == want.present).all() and got.spans == want.spans
    np.testing.assert_allclose(got.wall, want.wall, rtol=1e-12)
    return got


def test_step_sums_equal_the_stored_spans_and_resends_count_once(database_url):
    upgrade(database_url)
    engine = make_engine(database_url)
    rng = np.random.default_rng(11)
    a, b = _spans(rng, 600, -1, 8), _spans(rng, 400, 8, 16)
    store_rl.save_report(engine, "j", "node-a", a.take(np.arange(300)))
    store_rl.save_report(engine, "j", "node-b", b)
    store_rl.save_report(engine, "j", "node-a", a.take(np.arange(300)))  # resent whole
    store_rl.save_report(engine, "j", "node-a", a.take(np.arange(200, 600)))  # 100 resent, 300 new
    store_rl.save_report(engine, "j", "node-a", a.take(np.r_[np.arange(600), np.arange(50)]))  # dupes within
    got = _check(engine, "j")
    assert got.spans == 1000 and len(store_rl.read_spans(engine, "j")) == 1000
    _check(engine, "j", 2, 5)  # a part of the range
    idle = got.idle()
    assert np.isnan(idle[~got.present]).all() and (idle[got.present] >= 0).all()
    top, top_s = got.dominant()
    assert (top[~got.present] == -1).all()
    np.testing.assert_array_equal(top_s[got.present], got.seconds.max(axis=2)[got.present])
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT count(*) FROM rl_step_phases WHERE job_id = 'j'")).scalar()
    assert rows == len(set(zip(a.step.tolist(), ["a"] * 600, strict=True)) | set(
        zip(b.step.tolist(), ["b"] * 400, strict=True)))
    engine.dispose()


def test_migration_summarizes_spans_stored_before_it(database_url):
    upgrade(database_url, "0008")
    engine = make_engine(database_url)
    rng = np.random.default_rng(2)
    spans = _spans(rng, 300, -1, 6)
    cols = ("job_id", "node_id", "rank", "phase", "start_ts", "end_ts", "step", "version", "role", "tokens")
    with engine.begin() as conn:  # the 0008 schema: a plain insert, as the writer of then did
        conn.execute(sa.text(f"INSERT INTO rl_spans ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)})"),
                     [dict(zip(cols, ("old", "n0", int(r), int(p), float(s), float(e), int(k), int(k), int(ro), 0),
                                   strict=True))
                      for r, p, s, e, k, ro in zip(spans.rank, spans.phase, spans.start, spans.end, spans.step,
                                                   spans.role, strict=True)])
    upgrade(database_url)
    _check(engine, "old")
    engine.dispose()


def test_summarize_and_merge_add_up_and_refuse_narrowing():
    rng = np.random.default_rng(4)
    s = _spans(rng, 200, 0, 4)
    steps, rec = sp.summarize(s.step, s.rank, s.role, s.phase, s.start, s.end)
    one = steps == steps[0]
    _, first = sp.summarize(s.step[:100], s.rank[:100], s.role[:100], s.phase[:100], s.start[:100], s.end[:100])
    _, second = sp.summarize(s.step[100:], s.rank[100:], s.role[100:], s.phase[100:], s.start[100:], s.end[100:])
    assert rec.dtype.itemsize == 25 + 8 * len(PHASES)
    m = sp.merge(sp.widen(first[:0], len(PHASES)), rec[one])
    np.testing.assert_array_equal(m["seconds"], rec[one]["seconds"])
    assert int(sp.merge(first, second)["spans"].sum()) == 200
    with pytest.raises(ValueError, match="more than"):
        sp.widen(rec, 3)


def test_grid_is_the_same_in_order_shuffled_and_split_over_two_nodes():
    rng = np.random.default_rng(8)
    s = Spans.build(np.repeat(np.arange(5), 40), np.tile(np.arange(-1, 7), 25), np.zeros(200),
                    rng.integers(0, len(PHASES), 200), np.ones(200), np.arange(200.0), np.arange(200.0) + 1.5,
                    np.zeros(200))
    steps, rec = sp.summarize(s.step, s.rank, s.role, s.phase, s.start, s.end)  # 5 steps x 8 ranks, in order
    whole = sp.grid(steps, rec)
    assert whole.present.all() and whole.spans == 200 and whole.wall.tolist() == [40.5] * 5
    perm = rng.permutation(steps.size)
    for st, r in ((steps[perm], rec[perm]), (steps[perm][:30], rec[perm][:30])):  # shuffled; cells missing
        part = sp.grid(st, r)
        k = np.searchsorted(whole.steps, part.steps)[:, None]
        d = np.searchsorted(whole.ranks, part.ranks)[None, :]
        np.testing.assert_array_equal(part.seconds[part.present], whole.seconds[k, d][part.present])
        assert part.present.sum() == len(r)
    half = rec.copy()
    half["seconds"] /= 2  # every record split over two nodes: both halves add up
    two = sp.grid(np.r_[steps, steps], np.r_[half, half])
    np.testing.assert_allclose(two.seconds, whole.seconds)
    assert two.spans == 400 and (two.roles == whole.roles).all()
    top, top_s = whole.dominant()
    np.testing.assert_array_equal(top, whole.seconds.argmax(axis=2))


def test_rest_step_phases_serves_the_sums(database_url):
    import httpx

    from harness.simjob import SimJob
    from moeplane.controlplane.store.writes import StoreWriter
    from tests.controlplane.serverthread import running_server

    rng = np.random.default_rng(6)
    spans = _spans(rng, 300, -1, 5)
    with running_server(database_url) as srv:
        SimJob(StoreWriter(srv["engine"]), job_id="job-1", nodes=1).hello(1000.0)  # the job's row
        store_rl.save_report(srv["engine"], "job-1", "node-0", spans)
        store_rl.save_report(srv["engine"], "job-1", "node-0", spans)  # resent: nothing added
        want = _reference(store_rl.read_spans(srv["engine"], "job-1", 1, 5))
        base = f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs"
        with httpx.Client(base_url=base, timeout=20) as api:
            got = api.get("/job-1/rl/step-phases", params={"step_start": 1, "step_end": 5}).json()
            assert api.get("/job-1/rl/step-phases", params={"step_start": 5, "step_end": 1}).status_code == 422
            assert api.get("/nope/rl/step-phases").status_code == 404
    assert got["steps"] == want.steps.tolist() and got["ranks"] == want.ranks.tolist()
    assert got["spans"] == want.spans and got["phases"] == list(PHASES)
    seconds = np.array([[row if row is not None else [0.0] * len(PHASES) for row in s] for s in got["seconds"]])
    np.testing.assert_allclose(seconds, want.seconds, rtol=1e-12, atol=1e-9)
    present = np.array([[row is not None for row in s] for s in got["seconds"]])
    assert (present == want.present).all()
    assert (np.array([[x is None for x in s] for s in got["idle_s"]]) == ~present).all()
    assert (np.array(got["dominant"])[~present] == -1).all()
    np.testing.assert_allclose(got["wall_s"], want.wall, rtol=1e-12)
