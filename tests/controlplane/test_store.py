"""Store: migrations match the table definitions, writes are exactly-once, queries read back."""

from __future__ import annotations

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import alembic_config, current, downgrade, upgrade
from moeplane.controlplane.store.records import (
    DeviceRecord,
    HelloRecord,
    JobRecord,
    LoadsRecord,
    RankStatsRow,
    SamplesRecord,
    StepStatsRecord,
)
from moeplane.controlplane.store.tables import metadata
from moeplane.controlplane.store.writes import StoreWriter


@pytest.fixture
def engine(database_url):
    upgrade(database_url)
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def test_migrations_match_tables_and_downgrade(database_url):
    upgrade(database_url)
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
    assert current(database_url) == head
    eng = make_engine(database_url)
    with eng.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    eng.dispose()
    assert diff == []
    downgrade(database_url, "base")
    assert current(database_url) is None


def _hello(node="n0", job="j"):
    return HelloRecord(
        node, "h", "v", job, (0, 1),
        tuple(DeviceRecord(f"{node}/gpu{i}", i, "sim", "m", 1 << 30, i) for i in range(2)),
        JobRecord(job, layers=2, experts=3), 1.0,
    )


def test_exactly_once_and_queries(engine):
    w = StoreWriter(engine)
    assert w.register_hello(_hello()) == 0
    vals = np.array([[0.5, np.nan], [0.7, 3.0]])
    s = SamplesRecord("n0", 1, 10.0, ("n0/gpu0", "n0/gpu1"), ("utilization_ratio", "power_watts"), vals)
    c = np.arange(6, dtype=np.int64).reshape(2, 3)
    ld = LoadsRecord("n0", 2, "j", 4, 11.0, (0, 1), (), c)
    st = StepStatsRecord("n0", 3, "j", 4, 11.0, (RankStatsRow(0, 0.5, 0.1, 100), RankStatsRow(1, 0.6, 0.2, 90)))
    assert w.write([s, ld, st]) == [False, False, False]
    assert w.write([s, ld, st]) == [True, True, True]
    assert w.register_hello(_hello()) == 3  # resume point
    assert q.sample_count(engine) == 3  # NaN is 'not measured'
    hist = q.device_history(engine, "n0/gpu1", None, q.Range())
    assert [h["metric"] for h in hist] == ["power_watts", "utilization_ratio"]
    assert [h["value"] for h in hist] == pytest.approx([3.0, 0.7], rel=1e-7)  # stored as float32
    assert q.loads_history(engine, "j", q.Range(step_start=4, step_end=5), layer=1)[0]["counts"].tolist() == [3, 4, 5]
    assert [r["rank"] for r in q.step_stats_history(engine, "j", q.Range())] == [0, 1]
    assert q.get_job(engine, "j")["latest_step"] == 4
    with pytest.raises(q.NotFound):
        q.get_job(engine, "other")
    with pytest.raises(ValueError, match="layer"):
        q.loads_history(engine, "j", q.Range(), layer=2)


def test_range_validation():
    with pytest.raises(ValueError, match="limit"):
        q.Range(limit=0)
    with pytest.raises(ValueError, match="step_end"):
        q.Range(step_start=5, step_end=1)


def test_concurrent_plan_writers_never_share_an_epoch(engine):
    """Many threads create plans at once: every epoch is used once, none is lost."""
    from concurrent.futures import ThreadPoolExecutor

    from moeplane.controlplane.balancing.placement import identity_placement
    from moeplane.controlplane.store import plans as P

    StoreWriter(engine).register_hello(_hello())
    phy2log = identity_placement(2, 3, 2 * (2))
    with ThreadPoolExecutor(8) as pool:
        epochs = list(pool.map(
            lambda _i: P.create_plan(engine, "j", phy2log, world_size=2, slots_per_rank=2), range(16)
        ))
    assert sorted(epochs) == list(range(1, 17))


def test_hello_again_updates_only_what_changed(engine):
    """A reconnecting agent declares its job and devices again: the same values leave the rows
    alone (upserts with a change condition), a changed device replaces its row, a spec field
    not set yet fills in, and a spec that contradicts the job's shape is refused, job unchanged."""
    import dataclasses

    import sqlalchemy as sa

    from moeplane.controlplane.store import tables as t
    from moeplane.controlplane.store.claims import SpecConflict

    w = StoreWriter(engine)
    w.register_hello(_hello())
    w.register_hello(_hello())  # identical: no change
    bigger = _hello()
    bigger = dataclasses.replace(
        bigger,
        devices=(dataclasses.replace(bigger.devices[0], memory_total_bytes=2 << 30), bigger.devices[1]),
        job=JobRecord("j", layers=2, experts=3, top_k=2),
    )
    w.register_hello(bigger)
    with pytest.raises(SpecConflict, match="layers"):
        w.register_hello(dataclasses.replace(bigger, job=JobRecord("j", layers=4, experts=3, top_k=2)))
    with engine.connect() as conn:
        mem = dict(conn.execute(sa.select(t.devices.c.device_id, t.devices.c.memory_total_bytes)).all())
        job = conn.execute(sa.select(t.jobs.c.layers, t.jobs.c.experts, t.jobs.c.top_k)).one()
    assert mem == {"n0/gpu0": 2 << 30, "n0/gpu1": 1 << 30}
    assert tuple(job) == (2, 3, 2)
