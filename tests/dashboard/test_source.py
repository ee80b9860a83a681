import time

import numpy as np
import pytest
from sqlalchemy import event

from harness.simjob import SimJob
from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.controlplane.store.records import LoadsRecord
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.dashboard.placement import layer_balancedness, rank_loads
from moeplane.dashboard.source import (
    BalancednessCache,
    current_placement,
    placements_at_steps,
)


@pytest.fixture
def sim(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    job = SimJob(StoreWriter(engine), nodes=2, devices_per_node=4, layers=3, experts=12)
    job.hello(time.time())
    yield engine, job
    engine.dispose()


def test_placement_from_the_job_geometry(sim):
    engine, job = sim
    p = current_placement(engine, job.job_id, (3, 12))
    assert (p.geometry.ranks, p.geometry.slots_per_rank, p.source) == (8, 2, "identity")
    assert p.phy2log.shape == (3, 16)


def test_cache_reads_new_and_incomplete_steps_only(sim):
    engine, job = sim
    p = current_placement(engine, job.job_id, (3, 12))
    cache = BalancednessCache(window=3)
    want = {}
    for step in range(4):
        counts = job.step(step, time.time())
        want[step] = layer_balancedness(rank_loads(counts, p.phy2log, 8))
    steps, bal = cache.recent(engine, job.job_id, 3, p, nodes_expected=2)
    assert steps == [1, 2, 3]
    np.testing.assert_allclose(bal, np.stack([want[s] for s in steps]))
    # Step 4 arrives from node-0 first, then from node-1: the cache must not keep the half.
    parts = job.step_counts(4)

    def part(n):
        node = job.node_id(n)
        ranks = tuple(range(n * 4, n * 4 + 4))
        return LoadsRecord(node, job._next(node), job.job_id, 4, time.time(), ranks, (), parts[n])

    job.writer.write([part(0)])
    steps, bal = cache.recent(engine, job.job_id, 4, p, nodes_expected=2)
    assert steps == [2, 3, 4]
    np.testing.assert_allclose(bal[-1], layer_balancedness(rank_loads(parts[0], p.phy2log, 8)))
    job.writer.write([part(1)])
    steps, bal = cache.recent(engine, job.job_id, 4, p, nodes_expected=2)
    np.testing.assert_allclose(bal[-1], layer_balancedness(rank_loads(parts.sum(axis=0), p.phy2log, 8)))
    np.testing.assert_allclose(bal[:-1], np.stack([want[2], want[3]]))


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        BalancednessCache(window=0)


def placement_reads(engine) -> list[str]:
    """Every SELECT of the plans' placement blob on ``engine`` from now on."""
    reads: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("SELECT") and "phy2log" in statement:
            reads.append(statement)

    return reads


def test_placement_cache_reads_the_blob_once_per_running_plan(sim):
    engine, job = sim
    shape = (3, 12)
    cache = PlacementSource(engine)
    reads = placement_reads(engine)

    def refresh(shape=shape):
        """What a dashboard refresh shows (checked against the uncached read) and how many
        placement blob reads it issued."""
        before = len(reads)
        p = current_placement(engine, job.job_id, shape, cache)
        issued = len(reads) - before
        want = current_placement(engine, job.job_id, shape)
        assert (p.key, p.source) == (want.key, want.source)
        np.testing.assert_array_equal(p.phy2log, want.phy2log)
        return p.source, issued

    assert refresh() == ("identity", 0)  # no plan yet: no blob to read
    first = job.plan((job.identity() + 1) % job.experts)
    job.apply(first, step=10)
    job.plan((job.identity() + 2) % job.experts)  # proposed only: not running
    assert [refresh() for _ in range(3)] == [(f"epoch {first}", 1)] + [(f"epoch {first}", 0)] * 2
    second = job.plan((job.identity() + 3) % job.experts)
    job.apply(second, step=20)  # a new applied plan is read once
    assert [refresh() for _ in range(3)] == [(f"epoch {second}", 1)] + [(f"epoch {second}", 0)] * 2
    # a plan that does not fit the loads: identity, without reading the blob again to find that out
    assert [refresh((3, 6)) for _ in range(2)] == [("identity", 0), ("identity", 0)]
    # the running plan rolled back: the one before runs again (still cached), as without the cache
    P.transition(engine, job.job_id, second, Status.ROLLED_BACK)
    assert refresh() == (f"epoch {first}", 0)


def test_placement_cache_keeps_the_newest_entries_only(sim):
    engine, job = sim
    source = PlacementSource(engine, size=2)
    for i, step in enumerate((10, 20, 30)):
        job.apply(job.plan((job.identity() + 1 + i) % job.experts), step=step)
    reads = placement_reads(engine)
    source.at_steps(job_row(engine, job), [10, 20, 30])  # three plans: the first is evicted
    assert len(reads) == 3
    source.at_steps(job_row(engine, job), [20, 30])
    assert len(reads) == 3
    source.at_steps(job_row(engine, job), [10])
    assert len(reads) == 4
    with pytest.raises(ValueError, match="size"):
        PlacementSource(engine, size=0)


def job_row(engine, job):
    from moeplane.controlplane.store import queries as q

    return q.get_job(engine, job.job_id)


def test_geometry_follows_the_shape_shown(sim):
    engine, job = sim
    p = current_placement(engine, job.job_id, (3, 13))  # 8 ranks, ceil(13 / 8) = 2 slots each
    assert (p.geometry.ranks, p.geometry.slots_per_rank, p.phy2log.shape) == (8, 2, (3, 16))
    assert PlacementSource(engine).running(job_row(engine, job)).geometry.experts == 12


def test_history_placements_share_the_cache_with_the_live_view(sim):
    engine, job = sim
    shape, steps = (3, 12), [5, 10, 15, 20, 25]
    first = job.plan((job.identity() + 1) % job.experts)
    job.apply(first, step=10)
    second = job.plan((job.identity() + 2) % job.experts)
    job.apply(second, step=20)
    P.transition(engine, job.job_id, second, Status.ROLLED_BACK)
    want = placements_at_steps(engine, job.job_id, shape, steps)
    assert [p.source for p in want] == ["identity", f"epoch {first}", f"epoch {first}",
                                        f"epoch {second}", f"epoch {second}"]  # rolled back, but it ran
    cache = PlacementSource(engine)
    reads = placement_reads(engine)
    current_placement(engine, job.job_id, shape, cache)  # the live view reads the running plan
    assert len(reads) == 1
    for expected_reads in (2, 2):  # the history view then reads only the plan not seen yet, once
        got = placements_at_steps(engine, job.job_id, shape, steps, cache)
        assert len(reads) == expected_reads
        assert [(p.source, p.key) for p in got] == [(p.source, p.key) for p in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.phy2log, w.phy2log)
