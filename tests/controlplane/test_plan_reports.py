"""Plan reports recorded in batches: plans.record_reports (one transaction, an outcome per
report) and the ingest coalescer that feeds it, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from moeplane.controlplane.domain.lifecycle import Status
from moeplane.controlplane.ingest.planreports import PlanReports
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.queries import NotFound
from moeplane.controlplane.store.records import DeviceRecord, HelloRecord, JobRecord
from moeplane.controlplane.store.writes import StoreWriter

NODES = [f"n{i}" for i in range(4)]


def _hello(node: str, job: str) -> HelloRecord:
    return HelloRecord(
        node, "h", "v", job, (2 * int(node[1:]), 2 * int(node[1:]) + 1),
        tuple(DeviceRecord(f"{node}/gpu{i}", i, "sim", "m", 1 << 30, i) for i in range(2)),
        JobRecord(job, layers=2, experts=8), 1.0,
    )


@pytest.fixture
def engine(database_url):
    upgrade(database_url)
    eng = make_engine(database_url)
    w = StoreWriter(eng)
    for n in NODES:
        w.register_hello(_hello(n, "j"))
    w.register_hello(_hello("n9", "other"))  # a node of another job
    yield eng
    eng.dispose()


def pushed_plan(engine, kind="rebalance", base_epoch=0) -> int:
    phy2log = np.tile(np.arange(8, dtype=np.int64), (2, 1))  # [L=2, G*S=8]
    epoch = P.create_plan(engine, "j", phy2log, world_size=8, slots_per_rank=1, kind=kind,
                          base_epoch=base_epoch)
    P.transition(engine, "j", epoch, Status.APPROVED)
    P.transition(engine, "j", epoch, Status.PUSHED)
    return epoch


def statuses(engine, epoch) -> list[tuple[str, str | None]]:
    return [(e["status"], e["node_id"]) for e in P.plan_events(engine, "j", epoch)]


def test_outsider_fails_only_itself(engine):
    epoch = pushed_plan(engine)
    out = P.record_reports(engine, "j", epoch, [
        ("n0", "applied", 7, ""), ("n9", "applied", 7, ""), ("ghost", "received", 7, ""),
        ("n1", "applied", 7, ""),
    ])
    assert out[0] == {"status": "pushed", "waiting_for": 3}
    assert isinstance(out[1], PermissionError) and "'n9'" in str(out[1]) and "'j'" in str(out[1])
    assert isinstance(out[2], PermissionError) and "'ghost'" in str(out[2])
    assert out[3] == {"status": "pushed", "waiting_for": 2}
    assert statuses(engine, epoch)[-2:] == [("node_applied", "n0"), ("node_applied", "n1")]
    assert P.get_plan(engine, "j", epoch)["status"] == "pushed"


def test_unknown_plan_and_state(engine):
    out = P.record_reports(engine, "j", 99, [("n0", "applied", 1, ""), ("n1", "failed", 1, "x")])
    assert all(isinstance(o, NotFound) for o in out) and "plan 99" in str(out[0])
    with pytest.raises(NotFound):
        P.record_report(engine, "j", 99, "n0", "applied", 1)
    epoch = pushed_plan(engine)
    out = P.record_reports(engine, "j", epoch, [("n0", "done", 1, ""), ("n1", "received", 1, "")])
    assert isinstance(out[0], ValueError) and "'done'" in str(out[0])
    assert out[1] == {"status": "pushed"}


def test_batch_completing_the_job_applies_once(engine):
    epoch = pushed_plan(engine)
    assert P.record_report(engine, "j", epoch, "n0", "applied", 5) == {"status": "pushed", "waiting_for": 3}
    # n1 twice (two streams of one node) and a late received after the completing report
    out = P.record_reports(engine, "j", epoch, [
        ("n1", "applied", 5, ""), ("n1", "applied", 5, ""), ("n2", "applied", 5, ""),
        ("n3", "applied", 6, ""), ("n2", "received", 6, ""),
    ])
    assert out == [{"status": "pushed", "waiting_for": 2}, {"status": "pushed", "waiting_for": 2},
                   {"status": "pushed", "waiting_for": 1}, {"status": "applied"}, {"status": "applied"}]
    plan = P.get_plan(engine, "j", epoch)
    assert plan["status"] == "applied" and plan["applied_step"] == 6
    ev = statuses(engine, epoch)
    assert [s for s, _ in ev].count("applied") == 1
    assert ev[-2:] == [("applied", None), ("node_received", "n2")]  # the order one by one gives
    # more reports after it is applied change nothing
    assert P.record_reports(engine, "j", epoch, [("n0", "applied", 9, "")]) == [{"status": "applied"}]
    assert [s for s, _ in statuses(engine, epoch)].count("applied") == 1


def test_failed_report_in_batch_fails_the_plan(engine):
    epoch = pushed_plan(engine)
    out = P.record_reports(engine, "j", epoch, [
        ("n0", "applied", 5, ""), ("n1", "failed", 5, "out of memory"), ("n2", "applied", 5, ""),
        ("n3", "applied", 5, ""),
    ])
    assert out == [{"status": "pushed", "waiting_for": 3}, {"status": "failed"},
                   {"status": "failed"}, {"status": "failed"}]
    plan = P.get_plan(engine, "j", epoch)
    assert plan["status"] == "failed" and plan["applied_step"] is None
    failed = [e for e in P.plan_events(engine, "j", epoch) if e["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["node_id"] == "n1" and failed[0]["detail"] == "out of memory"


def test_failure_after_the_completing_report_does_not_undo_applied(engine):
    epoch = pushed_plan(engine)
    out = P.record_reports(engine, "j", epoch, [(n, "applied", 3, "") for n in NODES]
                           + [("n0", "failed", 4, "late")])
    assert out[-2:] == [{"status": "applied"}, {"status": "applied"}]
    assert P.get_plan(engine, "j", epoch)["status"] == "applied"


def test_rollback_plan_applied_in_a_batch_rolls_back_later_plans(engine):
    first = pushed_plan(engine)
    P.record_reports(engine, "j", first, [(n, "applied", 1, "") for n in NODES])
    second = pushed_plan(engine)
    P.record_reports(engine, "j", second, [(n, "applied", 2, "") for n in NODES])
    back = pushed_plan(engine, kind="rollback", base_epoch=first)
    assert P.record_reports(engine, "j", back, [(n, "applied", 3, "") for n in NODES])[-1] == {"status": "applied"}
    assert P.get_plan(engine, "j", second)["status"] == "rolled_back"
    assert P.get_plan(engine, "j", first)["status"] == "applied"


def test_coalescer_records_concurrent_reports_in_one_transaction(engine):
    epoch = pushed_plan(engine)

    async def main():
        co = PlanReports(engine, linger_s=0.05)
        results = await asyncio.gather(
            *(co.record("j", epoch, n, "applied", 8) for n in NODES),
            co.record("j", epoch, "n9", "applied", 8),
            return_exceptions=True,
        )
        return co, results

    co, results = asyncio.run(main())
    assert co.transactions == 1 and co.reports == 5
    assert results[:3] == [{"status": "pushed", "waiting_for": k} for k in (3, 2, 1)]
    assert results[3] == {"status": "applied"}
    assert isinstance(results[4], PermissionError)
    assert P.get_plan(engine, "j", epoch)["status"] == "applied"


def test_coalescer_splits_at_max_batch_and_bad_args(engine):
    epoch = pushed_plan(engine)

    async def main():
        co = PlanReports(engine, linger_s=0.05, max_batch=2)
        results = await asyncio.gather(*(co.record("j", epoch, n, "received", 1) for n in NODES))
        return co, results

    co, results = asyncio.run(main())
    assert co.transactions == 2 and results == [{"status": "pushed"}] * 4
    with pytest.raises(ValueError, match="linger_s"):
        PlanReports(engine, linger_s=-1)
    with pytest.raises(ValueError, match="max_batch"):
        PlanReports(engine, max_batch=0)


def test_reports_arriving_while_a_batch_records_go_in_one_next_transaction(engine, monkeypatch):
    import threading

    from moeplane.controlplane.ingest import planreports

    epoch = pushed_plan(engine)
    started, release, sizes = threading.Event(), threading.Event(), []
    real = P.record_reports

    def gated(engine_, job_id, epoch_, reports, clock=None):
        sizes.append(len(reports))
        if len(sizes) == 1:
            started.set()
            assert release.wait(30), "test never released the first batch"
        return real(engine_, job_id, epoch_, reports, clock)

    monkeypatch.setattr(planreports.plans, "record_reports", gated)

    async def main():
        co = PlanReports(engine, linger_s=0.0)
        first = asyncio.create_task(co.record("j", epoch, "n0", "applied", 1))
        assert await asyncio.to_thread(started.wait, 30)  # the first batch is in its transaction
        rest = [asyncio.create_task(co.record("j", epoch, "n1", "applied", 1))]
        for _ in range(100):  # ample loop turns for n1's batch to end its 0 s window
            await asyncio.sleep(0)
        # n1's batch waits for the first one's transaction, still taking reports
        rest += [asyncio.create_task(co.record("j", epoch, n, "applied", 1)) for n in NODES[2:]]
        for _ in range(100):
            await asyncio.sleep(0)
        release.set()
        return co, await asyncio.gather(first, *rest)

    co, results = asyncio.run(main())
    assert sizes == [1, 3] and co.transactions == 2
    assert results[-1] == {"status": "applied"}


def test_a_batch_closes_when_its_plans_reports_go_quiet_or_at_linger_s(engine):
    """Reports trickling in (a fan-out still under way) keep the batch open; it closes once
    they stop for quiet_s, or at linger_s even when they never stop."""
    epoch = pushed_plan(engine)

    async def trickle():
        co = PlanReports(engine, quiet_s=1.0, linger_s=60.0)
        tasks = []
        for n in NODES:  # 10 ms apart: each arrives well inside the 1 s quiet period
            tasks.append(asyncio.create_task(co.record("j", epoch, n, "received", 1)))
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return co

    co = asyncio.run(trickle())
    assert (co.transactions, co.reports) == (1, 4)

    async def capped():
        co = PlanReports(engine, quiet_s=60.0, linger_s=0.05)
        # a 60 s quiet period, but the batch closes at linger_s: this returns, it does not hang
        return await asyncio.wait_for(co.record("j", epoch, "n0", "applied", 2), 20)

    assert asyncio.run(capped()) == {"status": "pushed", "waiting_for": 3}
    with pytest.raises(ValueError, match="quiet_s"):
        PlanReports(engine, quiet_s=-1)
