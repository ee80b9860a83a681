"""Plan deltas: the control plane sends a plan that changes K slots as O(K) bytes against the
plan the stream delivered last; the agent rebuilds the full placement for its ranks (NodeLocal
carries full plans), and never applies a delta it cannot rebuild."""

from __future__ import annotations

import grpc
import httpx
import numpy as np

from moeplane.agents.spool import Spool
from moeplane.agents.uplink import Uplink, UplinkOptions
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array
from moeplane.controlplane.wire.plan_codec import delta_plan, full_plan
from tests.agents.procs import start_agent, stop, wait_path
from tests.agents.test_local_endpoint import Rank
from tests.controlplane.serverthread import running_server
from tests.procs import wait_until

# 4 layers x 16 experts on 2 ranks x 16 slots: large enough that a 2-slot delta is the smaller message
JOB = pb.JobSpec(job_id="j1", layers=4, experts=16, top_k=2, world_size=2, slots_per_rank=16,
                 ranks_per_node=2)


def swapped(base: np.ndarray, layer: int, a: int, b: int) -> np.ndarray:
    out = base.copy()
    out[layer, [a, b]] = out[layer, [b, a]]
    return out


P1 = swapped(np.tile(np.arange(32) % 16, (4, 1)), 0, 0, 5)
P2 = swapped(P1, 1, 2, 9)
P3 = swapped(P2, 2, 4, 7)


def placement(plan: pb.PlacementPlan) -> np.ndarray:
    """What a rank got: always a full plan, in any integer dtype."""
    assert plan.base_epoch == 0
    return decode_array(plan.phy2log, "plan.phy2log", ndim=2, kinds="iu")


def uplink(tmp_path) -> tuple[Uplink, list, list]:
    """The agent's uplink, not connected: plans handed to it as they would come off a stream."""
    controls: list[pb.ControlMessage] = []
    failed: list[tuple[pb.PlacementPlan, str]] = []
    up = Uplink(Spool(tmp_path / "spool"), UplinkOptions(), hello=pb.Hello, on_control=controls.append,
                on_plan_failed=lambda plan, error: failed.append((plan, error)))
    return up, controls, failed


def test_a_delta_whose_base_the_stream_did_not_deliver_is_failed_and_the_stream_goes_on(tmp_path):
    """A control plane sends a delta only against what the same stream delivered last; one
    against anything else (a reconnect, a lost base) is never applied."""
    up, controls, failed = uplink(tmp_path)
    up._on_plan(delta_plan(full_plan("j1", 6, P2, 16, 0), P2, 5, P1))  # no epoch 5 here
    assert controls == [] and failed[0][0].epoch == 6
    assert "base_epoch 5" in failed[0][1] and "no plan" in failed[0][1]
    up._on_plan(full_plan("j1", 7, P1, 16, 0))
    up._on_plan(delta_plan(full_plan("j1", 8, P3, 16, 0), P3, 7, P1))
    assert [c.plan.epoch for c in controls] == [7, 8]  # epoch 6 never reached the ranks
    np.testing.assert_array_equal(placement(controls[0].plan), P1)
    np.testing.assert_array_equal(placement(controls[1].plan), P3)  # rebuilt in full
    up._on_plan(delta_plan(full_plan("j1", 9, P2, 16, 0), P2, 7, P1))  # against an older epoch
    assert failed[-1][0].epoch == 9 and "base_epoch 7" in failed[-1][1]


def test_serve_sends_the_second_plan_as_a_delta_and_a_reconnect_in_full(database_url, tmp_path):
    with running_server(database_url, controller_interval_s=0.05) as srv:
        sent = srv["ingest"].plans.sent
        http = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=10)
        sock = tmp_path / "node-0.sock"
        agent = start_agent(tmp_path, srv["grpc_port"], "node-0", "--job-id", "j1", "--ranks", "0-1")
        channel = ranks = None
        try:
            wait_path(sock, agent)
            channel = grpc.insecure_channel(f"unix:{sock}")
            ranks = [Rank(channel, 0, JOB), Rank(channel, 1, JOB)]
            wait_until(lambda: http.get("/jobs/j1").json().get("world_size") == 2, what="job geometry")
            r = http.put("/jobs/j1/policy", json={"mode": "manual", "min_interval_s": 3600})
            assert r.status_code == 200, r.text  # only the operator's plans below

            def push_and_apply(phy2log, epoch_ranks):
                r = http.post("/jobs/j1/plans", json={"phy2log": phy2log.tolist()})
                assert r.status_code == 200, r.text
                epoch = r.json()["epoch"]
                for rank in epoch_ranks:
                    control = next(rank.responses)
                    assert control.WhichOneof("body") == "plan" and control.plan.epoch == epoch, control
                    plan = control.plan
                    np.testing.assert_array_equal(placement(plan), phy2log)
                    rank.outbox.put(pb.RankMessage(plan_report=pb.PlanReport(
                        job_id="j1", epoch=epoch, state=pb.PLAN_STATE_APPLIED, step=epoch)))
                wait_until(lambda: http.get(f"/jobs/j1/plans/{epoch}").json()["status"] == "applied",
                           what=f"plan {epoch} applied")
                return epoch

            push_and_apply(P1, ranks)
            assert (sent["full"], sent["delta"]) == (1, 0), http.get("/jobs/j1/plans").json()
            push_and_apply(P2, ranks)
            assert (sent["full"], sent["delta"]) == (1, 1), http.get("/jobs/j1/plans").json()
            # the agent restarts: its new stream gets the running plan in full, then deltas again
            for rank in ranks:
                rank.close()
            channel.close()
            assert stop(agent) == 0
            agent = start_agent(tmp_path, srv["grpc_port"], "node-0", "--job-id", "j1", "--ranks", "0-1")
            wait_until(lambda: sent["full"] == 2, what="the running plan sent in full on the new stream")
            wait_path(sock, agent)
            channel = grpc.insecure_channel(f"unix:{sock}")
            ranks = [Rank(channel, 0, JOB), Rank(channel, 1, JOB)]
            for rank in ranks:  # a rank attaching gets the running plan from its agent
                np.testing.assert_array_equal(placement(next(rank.responses).plan), P2)
            push_and_apply(P3, ranks)
            assert (sent["full"], sent["delta"]) == (2, 2)
        finally:
            for rank in ranks or []:
                rank.close()
            if channel is not None:
                channel.close()
            code = stop(agent)
            http.close()
        assert code == 0


def test_ranks_get_full_plans_in_a_narrow_dtype_and_accept_it(local_agent):
    server, channel = local_agent
    r0, r1 = Rank(channel, 0, JOB), Rank(channel, 1, JOB)
    server.wait(lambda s: (s.get("/jobs/j1") or {}).get("world_size") == 2, what="job geometry")
    epoch = server.push_plan("j1", P1)
    for r in (r0, r1):
        got = next(r.responses).plan
        assert got.epoch == epoch and got.phy2log.dtype == "uint8"  # 16 experts fit in uint8
        np.testing.assert_array_equal(placement(got), P1)
    r0.close()
    r1.close()
