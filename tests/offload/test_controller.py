"""OffloadController against a real store with an injected clock: timeouts, fencing, leases
separate from the rebalancing controller's, and per-node isolation of bad rows."""

from __future__ import annotations

import sqlalchemy as sa

from moeplane.controlplane.controller.leader import Leadership
from moeplane.controlplane.controller.offload import OffloadController, lease_name
from moeplane.controlplane.ingest.memory import profile_records
from moeplane.controlplane.store import memory_profiles as M
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.records import DeviceRecord, HelloRecord
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests.offload.profiles import G0, GIB, device_profile


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def store_with_job(database_url):
    upgrade(database_url)
    engine = make_engine(database_url)
    devices = tuple(DeviceRecord(f"node-0/gpu{i}", i, "sim", "SimGPU", 16 * GIB, i) for i in range(2))
    StoreWriter(engine).register_hello(
        HelloRecord("node-0", "host", "test", "job-1", (0, 1), devices, None, 1.0)
    )
    return engine


def save(engine, *profiles: pb.MemoryProfile, step: int = 10) -> None:
    msg = pb.MemoryProfiles(job_id="job-1", step=step, timestamp=1000.0 + step, host_free_bytes=64 * GIB,
                            devices=list(profiles))
    node, recs = profile_records(msg, node_id="node-0", job_id="job-1",
                                 known_devices={"node-0/gpu0", "node-0/gpu1"})
    M.save_profiles(engine, node, recs)


def test_pushed_decision_times_out_and_fencing_stops_a_deposed_leader(database_url):
    engine = store_with_job(database_url)
    clock = Clock()
    ctl = OffloadController(engine, bus=None, leadership=Leadership(engine, "a", clock), clock=clock)
    try:
        O.set_policy(engine, "job-1", {"decision_timeout_s": 30.0})
        save(engine, device_profile(G0, 0))
        [payload] = [m for _job, m in ctl.reconcile_all()]
        d = pb.OffloadDecision.FromString(payload)
        assert O.get_decision(engine, "job-1", d.decision_id)["status"] == "pushed"
        assert ctl.reconcile_all() == []  # nothing changed: nothing new
        clock.now += 29.0
        ctl.reconcile_all()
        assert O.get_decision(engine, "job-1", d.decision_id)["status"] == "pushed"
        clock.now += 2.0
        ctl.reconcile_all()
        failed = O.get_decision(engine, "job-1", d.decision_id)
        assert failed["status"] == "failed" and failed["error"] == "not applied before the timeout"
        # the offload lease is its own: the rebalancing controller's term of the job is untouched
        with engine.connect() as conn:
            leases = dict(conn.execute(sa.select(t.job_leases.c.job_id, t.job_leases.c.term)).all())
        assert leases == {lease_name("job-1"): 1}
        # another replica took over (its term is newer): the old leader's term is stale
        with engine.begin() as conn:
            conn.execute(sa.update(t.job_leases).where(t.job_leases.c.job_id == lease_name("job-1"))
                         .values(term=t.job_leases.c.term + 1, holder="b"))
        save(engine, device_profile(G0, 0, used=16 * GIB), step=11)
        assert ctl.reconcile_all() == []
        assert [x["decision_id"] for x in O.list_decisions(engine, "job-1")] == [d.decision_id]
        assert lease_name("job-1") not in ctl.leadership.terms
    finally:
        ctl.leadership.release_all()
        engine.dispose()


def test_lease_names_fit_the_lease_table():
    assert lease_name("job-1") == "offload:job-1"
    long = lease_name("j" * 128)
    assert len(long) <= 128 and long != lease_name("j" * 127 + "k")


def test_a_row_the_engine_refuses_stops_only_its_node(database_url):
    engine = store_with_job(database_url)
    ctl = OffloadController(engine, bus=None, leadership=Leadership(engine, "a"), clock=Clock())
    try:
        save(engine, device_profile(G0, 0))
        with engine.begin() as conn:  # written behind ingest's back: no layers to decide on
            conn.execute(sa.insert(t.node_memory).values(job_id="job-1", node_id="node-9", step=10, ts=1.0,
                                                         host_free_bytes=GIB))
            conn.execute(sa.insert(t.memory_profiles).values(
                job_id="job-1", device_id="node-9/gpu0", node_id="node-9", rank=5, step=10, ts=1.0,
                capacity_bytes=GIB, used_bytes=GIB // 2, parameters_bytes=0, gradients_bytes=0,
                optimizer_bytes=0, activations_peak_bytes=0, host_link_bytes_per_s=1e9,
                applied_actions="", layers="[]"))
        assert len(ctl.reconcile_all()) == 1
        assert [d["device_id"] for d in O.list_decisions(engine, "job-1")] == [G0]
        assert "node-9: devices[0].layers: at least one layer is needed" in ctl.status["job-1"]
    finally:
        ctl.leadership.release_all()
        engine.dispose()
