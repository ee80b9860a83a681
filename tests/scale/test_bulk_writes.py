"""Set-based batch writes keep exact dedup: repeats inside a batch, across batches, by (node,
seq) and by (job, step, node, ranks); on SQLite and PostgreSQL, above and below the COPY size."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from moeplane.controlplane.store import bulk
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.records import (
    DeviceRecord,
    HelloRecord,
    JobRecord,
    LoadsRecord,
    RankStatsRow,
    SamplesRecord,
    StepStatsRecord,
)
from moeplane.controlplane.store.writes import StoreWriter

L, E = 3, 4


@pytest.fixture
def writer(database_url):
    upgrade(database_url)
    engine = make_engine(database_url)
    w = StoreWriter(engine)
    for n in range(4):
        w.register_hello(HelloRecord(
            f"n{n}", "h", "t", "job", (2 * n, 2 * n + 1),
            tuple(DeviceRecord(f"n{n}/d{d}", d, "sim", "m", 1, 2 * n + d) for d in range(2)),
            JobRecord("job", L, E), 1.0))
    yield w
    engine.dispose()


def load(node: int, seq: int, step: int, rank: int, value: int) -> LoadsRecord:
    return LoadsRecord(f"n{node}", seq, "job", step, 100.0 + step, (rank,), (), np.full((L, E), value, np.int64))


def frame(node: int, seq: int, ts: float) -> SamplesRecord:
    return SamplesRecord(f"n{node}", seq, ts, (f"n{node}/d0", f"n{node}/d1"), ("a", "b"),
                         np.array([[ts, 1.0], [2.0, 3.0]]))


@pytest.mark.parametrize("size", [4, 3 * bulk.COPY_MIN_ROWS])
def test_batch_dedup_is_exact(writer, size):
    recs, want = [], np.zeros((L, E), np.int64)
    seq = {n: 0 for n in range(4)}
    for i in range(size):
        n = i % 4
        seq[n] += 1
        rank = 2 * n + (i // 4) % 2
        step = i // 8
        recs.append(load(n, seq[n], step, rank, i + 1))
        want += i + 1 if step == 0 else 0
    recs.append(recs[0])  # the same (node, seq) again in the batch
    renumbered = load(0, 999, 0, 0, 1000)  # same (job, step, node, ranks), new seq: a duplicate
    recs.append(renumbered)
    dup = writer.write(recs)
    assert dup == [False] * size + [True, True]
    # a resend of the whole batch is all duplicates and changes nothing
    assert writer.write(recs) == [True] * len(recs)
    latest = q.loads_history(writer.engine, "job", q.Range(), None)
    step0 = next(r for r in latest if r["step"] == 0)
    np.testing.assert_array_equal(step0["counts"], want)
    assert step0["nodes_reported"] == min(size, 8)
    assert q.count_rows(writer.engine, "received") == size + 1


@pytest.mark.parametrize("size", [3, 2 * bulk.COPY_MIN_ROWS])
def test_frames_stats_and_latest_per_node(writer, size):
    recs = [frame(i % 4, i // 4 + 1, 10.0 + i) for i in range(size)]
    recs += [StepStatsRecord(f"n{n}", 1000 + n, "job", 5, 50.0, (RankStatsRow(2 * n, 1.5, 0.1, 7),))
             for n in range(4)]
    assert writer.write(recs) == [False] * len(recs)
    assert writer.write(recs[:2]) == [True, True]
    with writer.engine.connect() as conn:
        frames = conn.execute(sa.select(sa.func.count()).select_from(t.sample_frames)).scalar()
        latest = dict(conn.execute(sa.select(t.node_latest.c.node_id, t.node_latest.c.ts)).all())
        stats = conn.execute(sa.select(sa.func.count()).select_from(t.step_stats)).scalar()
    assert frames == size and stats == 4
    for n in range(min(size, 4)):
        assert latest[f"n{n}"] == max(10.0 + i for i in range(size) if i % 4 == n)
    # an older frame arriving late does not replace the newest one
    writer.write([frame(0, 10_000, 1.0)])
    with writer.engine.connect() as conn:
        assert conn.execute(sa.select(t.node_latest.c.ts).where(t.node_latest.c.node_id == "n0")).scalar() \
            == latest["n0"]
