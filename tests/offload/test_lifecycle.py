"""Offload decision lifecycle end to end over real gRPC and HTTP, on SQLite and PostgreSQL:
profiles in, decisions persisted, auto push to the device's node only, manual approval,
reports with measured memory, cannot-meet decisions with their reason."""

from __future__ import annotations

import httpx

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


def test_auto_pushes_to_the_devices_node_and_records_measured_memory(cluster):
    http, a0, a1 = cluster
    ack = send(a0, memory(1, [device_profile(G0, 0), device_profile(G1, 1, used=12 * GIB)]))
    assert ack.code == 0, ack.message
    aio.run(a0.wait_for(lambda _r: offloads(a0)))
    [d] = offloads(a0)
    assert d.device_id == G0 and d.job_id == "job-1" and d.verdict == "apply" and d.rank == 0
    assert d.predicted_peak_bytes <= int(0.9 * 16 * GIB) and d.actions
    assert {a.kind for a in d.actions} <= {"offload_optimizer", "swap_activations", "recompute"}
    assert all(a.bytes_saved > 0 for a in d.actions)
    # node-1 gets only decisions for its own devices: its own arrives after node-0's on the bus
    assert send(a1, memory(1, [device_profile(H0, 2)])).code == 0
    aio.run(a1.wait_for(lambda _r: offloads(a1)))
    assert [x.device_id for x in offloads(a1)] == [H0]
    assert [x.device_id for x in offloads(a0)] == [G0]

    stored = http.get(f"/offload/decisions/{d.decision_id}").json()
    assert stored["status"] == "pushed" and stored["verdict"] == "apply"
    assert stored["peak_now_bytes"] == 15 * GIB and stored["predicted_peak_bytes"] == d.predicted_peak_bytes
    assert [e["status"] for e in stored["events"]] == ["proposed", "approved", "pushed"]
    # gpu1 sits between the watermarks: no decision for it
    assert {x["device_id"] for x in http.get("/offload/decisions").json()} == {G0, H0}

    ack = send(a0, report(2, d.decision_id, G0, used=14 * GIB + 7, saved=GIB - 7))
    assert ack.code == 0, ack.message
    applied = http.get(f"/offload/decisions/{d.decision_id}").json()
    assert applied["status"] == "applied" and applied["applied_step"] == 12
    assert applied["measured_used_bytes"] == 14 * GIB + 7 and applied["measured_saved_bytes"] == GIB - 7
    assert applied["predicted_saved_bytes"] == 15 * GIB - d.predicted_peak_bytes
    assert [e["status"] for e in applied["events"]][-2:] == ["node_applied", "applied"]

    # the next profile has the actions in effect and sits under the high watermark: nothing new
    in_effect = [f"{a.kind}:{layer}" for a in d.actions for layer in a.layers]
    assert send(a0, memory(3, [device_profile(G0, 0, used=applied["measured_used_bytes"], applied=in_effect)],
                           step=13)).code == 0
    view = poll(lambda: [m for m in http.get("/memory").json() if m["device_id"] == G0 and m["step"] == 13],
                what="profile of step 13")[0]
    assert view["applied_actions"] == in_effect and view["decision"]["status"] == "applied"
    assert view["capacity_bytes"] == 16 * GIB and view["parameters_bytes"] == 2 * GIB
    assert view["other_bytes"] == view["used_bytes"] - 14 * GIB
    assert view["high_watermark_bytes"] == int(0.9 * 16 * GIB) and view["host_free_bytes"] == 64 * GIB
    assert "layers" not in view or view["layers"] is None
    with_layers = http.get("/memory", params={"layers": True}).json()
    assert [x["name"] for x in with_layers[0]["layers"]] == [f"layers.{i}" for i in range(4)]
    # an older, resent profile never overwrites the newer one
    assert send(a0, memory(4, [device_profile(G0, 0)], step=10)).code == 0
    assert [m["step"] for m in http.get("/memory").json() if m["device_id"] == G0] == [13]


def test_manual_waits_for_approval_and_guards_transitions(cluster):
    http, a0, a1 = cluster
    assert http.get("/offload/policy").json()["mode"] == "auto"
    r = http.put("/offload/policy", json={"mode": "manual"})
    assert r.status_code == 200 and r.json()["mode"] == "manual" and r.json()["high_watermark"] == 0.9
    for bad in ({"mode": "sometimes"}, {"high_watermark": 1.5}, {"low_watermark": 0.95},
                {"decision_timeout_s": 0}, {"colour": "red"}):
        r = http.put("/offload/policy", json=bad)
        assert r.status_code == 422 and next(iter(bad)) in r.text, (bad, r.text)  # the error names the key
    assert http.get("/offload/policy").json()["mode"] == "manual"
    assert send(a0, memory(1, [device_profile(G0, 0)])).code == 0
    proposed = poll(lambda: http.get("/offload/decisions", params={"status": "proposed"}).json(), what="proposal")
    decision_id = proposed[0]["decision_id"]
    assert proposed[0]["device_id"] == G0 and proposed[0]["actions"]
    assert offloads(a0) == []  # nothing is pushed without a human
    r = http.post(f"/offload/decisions/{decision_id}/approve")
    assert r.status_code == 200 and r.json()["status"] == "pushed"
    aio.run(a0.wait_for(lambda _r: offloads(a0)))
    assert offloads(a0)[0].decision_id == decision_id
    assert http.post(f"/offload/decisions/{decision_id}/approve").status_code == 409
    assert http.post(f"/offload/decisions/{decision_id}/reject").status_code == 409
    assert http.post("/offload/decisions/999/approve").status_code == 404
    assert http.post("/offload/decisions/999/reject").status_code == 404
    assert http.get("/offload/decisions/0").status_code == 422
    assert httpx.get(str(http.base_url).replace("job-1", "nope") + "/offload/decisions").status_code == 404
    # a failed report keeps its reason
    ack = send(a0, report(2, decision_id, G0, pb.PLAN_STATE_FAILED, error="CUDA OOM while pinning"))
    assert ack.code == 0, ack.message
    failed = http.get(f"/offload/decisions/{decision_id}").json()
    assert failed["status"] == "failed" and failed["error"] == "CUDA OOM while pinning"
    assert failed["measured_used_bytes"] is None


def test_rejected_decision_is_not_proposed_again_and_a_changed_one_supersedes(cluster):
    http, a0, _a1 = cluster
    http.put("/offload/policy", json={"mode": "manual"})
    assert send(a0, memory(1, [device_profile(G0, 0)])).code == 0
    first = poll(lambda: http.get("/offload/decisions").json(), what="proposal")[0]
    assert http.post(f"/offload/decisions/{first['decision_id']}/reject").json()["status"] == "rejected"
    # the same profile again, beside a new full device: one tick decides both; only gpu1 is new
    assert send(a0, memory(2, [device_profile(G0, 0), device_profile(G1, 1)], step=11)).code == 0
    poll(lambda: http.get("/offload/decisions", params={"device_id": G1}).json(), what="gpu1 decision")
    assert [d["decision_id"] for d in http.get("/offload/decisions", params={"device_id": G0}).json()] == [
        first["decision_id"]]
    # a much fuller device needs a different action set: proposed; going back supersedes it
    assert send(a0, memory(3, [device_profile(G0, 0, used=16 * GIB)], step=12)).code == 0
    second = poll(lambda: http.get("/offload/decisions", params={"status": "proposed", "device_id": G0}).json(),
                  what="2nd")[0]
    assert second["decision_id"] > first["decision_id"] and second["peak_now_bytes"] == 16 * GIB
    assert second["predicted_peak_bytes"] <= int(0.9 * 16 * GIB)
    assert send(a0, memory(4, [device_profile(G0, 0)], step=14)).code == 0
    poll(lambda: http.get(f"/offload/decisions/{second['decision_id']}").json()["status"] == "superseded",
         what="supersede")
    assert http.post(f"/offload/decisions/{second['decision_id']}/approve").status_code == 409
    events = http.get(f"/offload/decisions/{second['decision_id']}").json()["events"]
    assert events[-1]["status"] == "superseded" and events[-1]["detail"].startswith("by decision ")
    statuses = [d["status"] for d in http.get("/offload/decisions", params={"device_id": G0}).json()]
    assert statuses == ["proposed", "superseded", "rejected"]


def test_cannot_meet_is_visible_with_its_reason_and_never_pushed(cluster):
    http, a0, _a1 = cluster
    assert http.put("/offload/policy", json={"high_watermark": 0.3, "low_watermark": 0.2}).status_code == 200
    assert send(a0, memory(1, [device_profile(G0, 0)])).code == 0
    d = poll(lambda: http.get("/offload/decisions", params={"device_id": G0}).json(), what="decision")[0]
    assert d["verdict"] == "cannot_meet" and d["status"] == "advisory" and d["actions"] == []
    assert "high watermark" in d["reason"] and str(int(0.3 * 16 * GIB)) in d["reason"]
    assert http.post(f"/offload/decisions/{d['decision_id']}/approve").status_code == 409
    [view] = [m for m in http.get("/memory").json() if m["device_id"] == G0]
    assert view["decision"]["verdict"] == "cannot_meet" and view["decision"]["reason"] == d["reason"]
    assert offloads(a0) == []
