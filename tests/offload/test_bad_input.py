"""Bad memory profiles and offload reports over real gRPC: a clear INVALID_ARGUMENT or
PERMISSION_DENIED ack naming the field, nothing stored, nothing applied."""

from __future__ import annotations

import math

from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.offload.profiles import (
    G0,
    G1,
    GIB,
    H0,
    device_profile,
    memory,
    offloads,
    poll,
    report,
    send,
)


def broken(**changes) -> pb.MemoryProfile:
    p = device_profile(G0, 0)
    for key, value in changes.items():
        if key.startswith("layer0_"):
            setattr(p.layers[0], key.removeprefix("layer0_"), value)
        else:
            setattr(p, key, value)
    return p


BAD_PROFILES = [
    (broken(used_bytes=-1), "memory.devices[0].used_bytes"),
    (broken(optimizer_bytes=-5), "memory.devices[0].optimizer_bytes"),
    (broken(layer0_activation_bytes=-1), "memory.devices[0].layers[0].activation_bytes"),
    (broken(layer0_forward_s=math.nan), "memory.devices[0].layers[0].forward_s"),
    (broken(used_bytes=17 * GIB), "memory.devices[0].used_bytes"),
    (broken(activations_peak_bytes=9 * GIB), "breakdown"),  # 2 + 2 + 4 + 9 GiB > 16 GiB
    (broken(layer0_activation_bytes=12 * GIB, activations_peak_bytes=2 * GIB), "more than capacity_bytes"),
    (broken(layer0_parameter_bytes=3 * GIB), "parameter_bytes add up to"),
    (broken(host_link_bytes_per_s=0.0), "memory.devices[0].host_link_bytes_per_s"),
    (broken(device_id="node-1/gpu0"), "unknown device 'node-1/gpu0' of node 'node-0'"),
    (broken(device_id="node-0/gpu7"), "unknown device"),
    (device_profile(G0, 0, applied=("recompute:layers.9",)), "unknown layer 'layers.9'"),
    (device_profile(G0, 0, applied=("defragment:layers.0",)), "memory.devices[0].applied_actions[0]"),
    (device_profile(G0, 0, applied=("swap_activations:layers.0", "recompute:layers.0")), "memory.devices[0].applied_actions[1]: layer 'layers.0' cannot both"),
    (device_profile(G0, 0, layers=0), "memory.devices[0].layers"),
]


def test_bad_profiles_are_rejected_naming_the_field_and_nothing_is_stored(cluster):
    http, a0, _a1 = cluster
    for i, (profile, expected) in enumerate(BAD_PROFILES):
        ack = send(a0, memory(10 + i, [device_profile(G1, 1), profile]))
        assert ack.code == 3, (expected, ack)
        assert expected.replace("devices[0]", "devices[1]") in ack.message, (expected, ack.message)
    for msg, expected in [
        (memory(40, [device_profile(G0, 0)], host_free=-1), "memory.host_free_bytes"),
        (memory(41, [device_profile(G0, 0)], step=-3), "memory.step"),
        (memory(42, []), "memory.devices"),
        (memory(43, [device_profile(G0, 0), device_profile(G0, 0)]), "duplicate device"),
        (memory(44, [device_profile(G0, 0)], job_id=""), "memory.job_id"),
    ]:
        ack = send(a0, msg)
        assert ack.code == 3 and expected in ack.message, (expected, ack)
    ack = send(a0, memory(50, [device_profile(G0, 0)], job_id="job-2"))
    assert ack.code == 7 and "job-2" in ack.message
    assert http.get("/memory").json() == []
    assert http.get("/offload/decisions").json() == []
    # the stream goes on: a good profile afterwards is stored and decided on
    assert send(a0, memory(60, [device_profile(G0, 0)])).code == 0
    aio.run(a0.wait_for(lambda _r: offloads(a0)))
    assert [m["device_id"] for m in http.get("/memory").json()] == [G0]


def test_bad_reports_are_rejected_and_nothing_is_applied(cluster):
    http, a0, a1 = cluster
    assert send(a0, memory(1, [device_profile(G0, 0)])).code == 0
    aio.run(a0.wait_for(lambda _r: offloads(a0)))
    decision_id = offloads(a0)[0].decision_id
    cases = [
        (a0, report(2, 987654, G0), 3, "offload_report.decision_id"),
        (a0, report(3, decision_id, G0, job_id="job-2"), 3, "offload_report.decision_id"),
        (a0, report(4, decision_id, G1), 3, "device_id"),
        (a0, report(5, decision_id, G0, used=-1), 3, "offload_report.measured_used_bytes"),
        (a0, report(6, decision_id, G0, saved=-1), 3, "offload_report.measured_saved_bytes"),
        (a0, report(7, decision_id, G0, used=17 * GIB), 3, "measured_used_bytes"),
        (a0, report(8, decision_id, G0, state=pb.PLAN_STATE_UNSPECIFIED), 3, "offload_report.state"),
        (a0, report(9, decision_id, G0, state=pb.PLAN_STATE_FAILED), 3, "offload_report.error"),
        (a0, report(10, 0, G0), 3, "offload_report.decision_id"),
        (a1, report(11, decision_id, H0), 7, "node-0"),  # node-1 reporting on node-0's decision
        (a1, report(12, decision_id, G0), 7, "node-0"),
    ]
    for agent, msg, code, expected in cases:
        ack = send(agent, msg)
        assert ack.code == code and expected in ack.message, (expected, ack)
    d = http.get(f"/offload/decisions/{decision_id}").json()
    assert d["status"] == "pushed" and d["measured_used_bytes"] is None
    assert [e["status"] for e in d["events"]] == ["proposed", "approved", "pushed"]
    # a received report is an event, the good applied report applies it
    assert send(a0, report(20, decision_id, G0, state=pb.PLAN_STATE_RECEIVED)).code == 0
    assert send(a0, report(21, decision_id, G0)).code == 0
    d = poll(lambda: (x := http.get(f"/offload/decisions/{decision_id}").json())["status"] == "applied" and x,
             what="applied")
    assert d["measured_used_bytes"] == 14 * GIB
    # a late failure report of an applied decision changes nothing but the history
    assert send(a0, report(22, decision_id, G0, state=pb.PLAN_STATE_FAILED, error="late")).code == 0
    d = http.get(f"/offload/decisions/{decision_id}").json()
    assert d["status"] == "applied" and d["events"][-1]["status"] == "node_failed"
