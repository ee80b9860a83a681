"""Memory offload through the agent: profiles up (rate-limited, device ids of the ranks' hellos,
free host memory), decisions down to the right rank once per decision_id, reports up."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents.offload import OffloadRelay
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests.agents.test_local_endpoint import Rank

GIB = 1 << 30


def profile(used: int = 12 * GIB, layers: int = 2) -> pb.MemoryProfile:
    return pb.MemoryProfile(
        capacity_bytes=16 * GIB, used_bytes=used, parameters_bytes=GIB, gradients_bytes=GIB,
        optimizer_bytes=2 * GIB, activations_peak_bytes=4 * GIB, host_link_bytes_per_s=1e10,
        layers=[pb.LayerMemory(name=f"layers.{i}", activation_bytes=2 * GIB, forward_s=0.01,
                               backward_s=0.02) for i in range(layers)],
    )


def decision(decision_id: int, device_id: str, rank: int = 0) -> pb.OffloadDecision:
    return pb.OffloadDecision(
        job_id="j1", decision_id=decision_id, device_id=device_id, rank=rank, verdict="apply",
        actions=[pb.OffloadAction(kind="recompute", layers=["layers.0"], bytes_saved=GIB)])


def relay(interval_s: float = 10.0):
    sent: list[pb.AgentMessage] = []

    def emit(msg: pb.AgentMessage) -> int:
        sent.append(msg)
        return len(sent)

    return OffloadRelay(emit, interval_s=interval_s, host_free=lambda: 5 * GIB,
                        clock=lambda: 100.0), sent  # unix seconds; the tests pass monotonic ``now``


def test_profiles_go_up_at_most_once_per_interval_with_the_latest_of_each_rank():
    r, sent = relay(interval_s=10.0)
    assert r.flush("j1", now=0.0) is None  # nothing pending
    r.add_profile(1, "node-0/gpu1", 7, profile())
    r.add_profile(0, "node-0/gpu0", 7, profile())
    assert r.flush("j1", now=0.0) == 1  # the first goes at once
    r.add_profile(0, "node-0/gpu0", 8, profile(used=10 * GIB))
    r.add_profile(0, "node-0/gpu0", 9, profile(used=11 * GIB))
    assert r.flush("j1", now=9.9) is None
    assert r.flush("j1", now=10.0) == 2
    first, second = (m.memory for m in sent)
    assert (first.job_id, first.step, first.host_free_bytes) == ("j1", 7, 5 * GIB)
    assert [(d.device_id, d.rank) for d in first.devices] == [("node-0/gpu0", 0),
                                                             ("node-0/gpu1", 1)]
    assert second.step == 9 and [d.used_bytes for d in second.devices] == [11 * GIB]


@pytest.mark.parametrize(("bad", "field"), [
    (pb.MemoryProfile(capacity_bytes=0), "capacity_bytes"),
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=11, host_link_bytes_per_s=1.0), "used_bytes"),
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=1), "host_link_bytes_per_s"),
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=1, host_link_bytes_per_s=1.0), "layers"),
    # checks the agent did not have before it ran the control plane's own
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=1, host_link_bytes_per_s=1.0, layers=[
        pb.LayerMemory(name="l0"), pb.LayerMemory(name="l0")]), "layers"),  # names repeat
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=1, host_link_bytes_per_s=1.0, parameters_bytes=8,
                      gradients_bytes=8, layers=[pb.LayerMemory(name="l0")]),
     ": the breakdown"),  # parameters + gradients are more than the capacity
    (pb.MemoryProfile(capacity_bytes=10, used_bytes=1, host_link_bytes_per_s=1.0, layers=[
        pb.LayerMemory(name="l0", forward_s=float("nan"))]), "layers\\[0\\].forward_s"),
])
def test_a_profile_the_control_plane_would_refuse_is_dropped_naming_the_field(bad, field):
    r, sent = relay()
    with pytest.raises(ValueError, match=f"step.memory{field}" if field.startswith(":") else
                       f"step.memory.{field}"):
        r.add_profile(0, "node-0/gpu0", 1, bad)
    with pytest.raises(ValueError, match="device_id"):
        r.add_profile(0, "", 1, profile())
    assert r.flush("j1", now=0.0) is None and sent == []


def test_decisions_are_deduplicated_and_reports_name_the_rank_device():
    r, sent = relay()
    assert r.on_decision(decision(3, "node-0/gpu0"))
    assert not r.on_decision(decision(3, "node-0/gpu0"))  # resent after a hello
    assert r.on_decision(decision(2, "node-0/gpu0"))  # older, unseen: received, not newest
    assert r.for_device("node-0/gpu0").decision_id == 3
    assert [(m.offload_report.decision_id, m.offload_report.state) for m in sent] == [
        (3, pb.PLAN_STATE_RECEIVED), (2, pb.PLAN_STATE_RECEIVED)]
    r.report(0, "node-0/gpu0", "j1", pb.OffloadReport(decision_id=3, state=pb.PLAN_STATE_APPLIED,
                                                      measured_saved_bytes=5))
    assert (sent[-1].offload_report.device_id, sent[-1].offload_report.job_id) == (
        "node-0/gpu0", "j1")
    with pytest.raises(ValueError, match="offload_report.device_id"):
        r.report(0, "node-0/gpu0", "j1", pb.OffloadReport(decision_id=3, device_id="node-0/gpu1"))
    with pytest.raises(ValueError, match="offload_report.decision_id"):
        r.report(0, "node-0/gpu0", "j1", pb.OffloadReport(decision_id=0))


def next_offload(rank: Rank) -> pb.OffloadDecision:
    for control in rank.responses:
        if control.WhichOneof("body") == "offload":
            return control.offload
        assert control.WhichOneof("body") != "ack" or control.ack.code == 0, control
    raise AssertionError("stream ended")


@pytest.fixture
def agent_args() -> tuple[str, ...]:
    return ("--memory-interval", "0.1")  # for local_agent


@pytest.fixture
def server_args() -> dict:
    return {"controller": True, "extra": ("--rebalance-mode", "manual")}  # offload decides


def test_the_agent_process_carries_profiles_decisions_and_reports(local_agent):
    server, channel = local_agent
    ranks: list[Rank] = []
    try:
        # rank 1 runs a device the sim collector does not know: it is announced in a hello
        ranks = [Rank(channel, 0), Rank(channel, 1, device_id="node-0/cpu1")]
        server.wait(lambda s: any(d["device_id"] == "node-0/cpu1" and d["kind"] == "rank"
                                  for d in s.api.get("/devices").json()), what="cpu1 announced")
        server.api.put("/jobs/j1/offload/policy", json={
            "mode": "auto", "high_watermark": 0.7, "low_watermark": 0.5}).raise_for_status()
        for step in range(3):
            for r in ranks:
                r.step(step, np.ones((2, 4), np.int64), profile(used=(10 + step) * GIB))

        def latest_profiles(s):
            got = {d["device_id"]: d for d in (s.get("/jobs/j1/memory") or [])}
            return got if len(got) == 2 and all(d["used_bytes"] == 12 * GIB for d in got.values()) else None

        latest = server.wait(latest_profiles, what="both ranks' step-2 profiles")
        assert {(d, v["rank"]) for d, v in latest.items()} == {("node-0/gpu0", 0), ("node-0/cpu1", 1)}
        # 12 of 16 GiB is above the 0.7 watermark: a decision for each rank's own device
        got = {i: next_offload(r) for i, r in enumerate(ranks)}
        assert (got[0].device_id, got[1].device_id) == ("node-0/gpu0", "node-0/cpu1")
        ranks[1].outbox.put(pb.RankMessage(offload_report=pb.OffloadReport(
            decision_id=got[1].decision_id, state=pb.PLAN_STATE_APPLIED, step=3,
            measured_used_bytes=9 * GIB, measured_saved_bytes=GIB)))
        applied = server.wait(lambda s: [d for d in (s.get("/jobs/j1/offload/decisions") or [])
                                         if d["status"] == "applied"], what="the decision applied")
    finally:
        for r in ranks:
            r.close()
    assert [(d["decision_id"], d["device_id"], d["rank"]) for d in applied] == [
        (got[1].decision_id, "node-0/cpu1", 1)]
