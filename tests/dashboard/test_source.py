import time

import numpy as np
import pytest

from controlplane.store.engine import make_engine
from controlplane.store.migrate import upgrade
from controlplane.store.records import LoadsRecord
from controlplane.store.writes import StoreWriter
from dashboard.placement import layer_balancedness, rank_loads
from dashboard.source import BalancednessCache, current_placement
from tests.dashboard.simjob import SimJob


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
