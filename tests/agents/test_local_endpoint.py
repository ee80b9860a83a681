"""NodeLocal over the agent's Unix socket: validation, aggregation upward, plan fan-out."""

from __future__ import annotations

import queue
import threading

import grpc
import numpy as np
import pytest

from moeplane.controlplane.procs import wait_until
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc
from moeplane.controlplane.wire.arrays import encode_array
from tests.agents.procs import stop

JOB = pb.JobSpec(job_id="j1", layers=2, experts=4, top_k=1, world_size=2, slots_per_rank=2,
                 ranks_per_node=2)


class Controls:
    """The agent's ``RankControl`` messages to one rank, read by a thread so that ``next()``
    fails after ``seconds`` instead of hanging the test; the stream's end and its error
    (``grpc.RpcError``) come through ``next()`` as they would from the gRPC iterator."""

    _END = object()

    def __init__(self, stream, rank: int, seconds: float = 30.0):
        self.rank, self.seconds = rank, seconds
        self._got: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        try:
            for control in stream:
                self._got.put(control)
            self._got.put(self._END)
        except grpc.RpcError as exc:
            self._got.put(exc)

    def __iter__(self):
        return self

    def __next__(self) -> pb.RankControl:
        try:
            item = self._got.get(timeout=self.seconds)
        except queue.Empty:
            raise AssertionError(f"rank {self.rank}: no message from the agent within "
                                 f"{self.seconds} s") from None
        if item is self._END:
            self._got.put(item)  # the stream stays ended
            raise StopIteration
        if isinstance(item, grpc.RpcError):
            self._got.put(item)
            raise item
        return item


class Rank:
    """A synchronous NodeLocal client: messages in through a queue, controls out."""

    def __init__(self, channel: grpc.Channel, rank: int, job: pb.JobSpec = JOB,
                 device_id: str = ""):
        self.outbox: queue.Queue = queue.Queue()
        self.outbox.put(pb.RankMessage(hello=pb.RankHello(
            job=job, rank=rank, device_id=device_id or f"node-0/gpu{rank}")))
        self.call = pb_grpc.NodeLocalStub(channel).Attach(iter(self.outbox.get, None))
        self.responses = Controls(self.call, rank)

    def step(self, step: int, counts: np.ndarray, memory: pb.MemoryProfile | None = None) -> None:
        self.outbox.put(pb.RankMessage(step=pb.RankStep(
            step=step, counts=encode_array(counts), timestamp=1.7e9, memory=memory,
            stats=pb.RankStepStats(rank=0, step_time_s=0.5, host_bound_ratio=0.25, tokens=9))))

    def close(self) -> None:
        self.outbox.put(None)


def test_bad_step_is_rejected_on_the_stream_and_good_steps_are_summed(local_agent):
    server, channel = local_agent
    r0, r1 = Rank(channel, 0), Rank(channel, 1)
    r0.step(0, np.ones((3, 4), np.int64))  # wrong [L, E]
    ack = next(r0.responses).ack
    assert ack.code == 3 and "step.counts.shape" in ack.message and ack.seq == 0
    r0.step(0, np.full((2, 4), 2, np.int64))  # the stream survived
    r1.step(0, np.full((2, 4), 5, np.int64))
    loads = server.wait(lambda s: s.get("/jobs/j1/loads/latest"), what="step 0")
    assert loads["step"] == 0 and np.array_equal(loads["counts"], np.full((2, 4), 7))
    assert server.rows("SELECT ranks FROM load_parts WHERE job_id = 'j1'") == [("0,1",)]

    def host_bound(s):
        got = {d["device_id"]: d["metrics"].get("host_bound_ratio")
               for d in s.api.get("/devices/latest").json()}
        return got if got.get("node-0/gpu1") is not None else None

    hb = server.wait(host_bound, what="host_bound_ratio in a sample")
    assert hb["node-0/gpu0"] == 0.25 and hb["node-0/gpu1"] == 0.25
    assert hb.get("node-0/gpu2") is None and hb.get("node-0/gpu3") is None
    epoch = server.push_plan("j1", np.array([[0, 1, 2, 3], [3, 2, 1, 0]]))
    assert next(r1.responses).plan.epoch == epoch
    assert next(r0.responses).plan.epoch == epoch
    for r in (r0, r1):
        r.outbox.put(pb.RankMessage(plan_report=pb.PlanReport(
            job_id="j1", epoch=epoch, state=pb.PLAN_STATE_APPLIED, step=12)))
    server.wait(lambda s: s.plan("j1", epoch)["status"] == "applied", what="the plan applied")
    r0.close()
    r1.close()


def test_a_rank_of_another_job_is_refused(local_agent):
    _, channel = local_agent
    other = pb.JobSpec()
    other.CopyFrom(JOB)
    other.job_id = "not-mine"
    rank = Rank(channel, 0, other)
    with pytest.raises(grpc.RpcError) as err:
        next(rank.responses)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hello.job.job_id" in err.value.details()
    rank.close()


def test_each_attaching_rank_is_announced_with_its_device(local_agent):
    """The sim collector already knows node-0/gpu0 and gpu1: a rank attaching to one changes
    only which rank runs it, and the agent still sends a fresh Hello saying so."""
    server, channel = local_agent

    def rank_of(device: str):
        return lambda s: {d["device_id"]: d["rank"] for d in s.api.get("/devices").json()}.get(device)

    r0 = Rank(channel, 0)
    server.wait(lambda s: rank_of("node-0/gpu0")(s) == 0, what="gpu0 announced as rank 0")
    r1 = Rank(channel, 1)
    server.wait(lambda s: rank_of("node-0/gpu1")(s) == 1, what="gpu1 announced as rank 1")
    devices = sorted((d["device_id"], d["rank"]) for d in server.api.get("/devices").json())
    assert devices[:2] == [("node-0/gpu0", 0), ("node-0/gpu1", 1)]
    r0.close()
    r1.close()


def test_a_device_only_a_rank_knows_gets_samples_of_what_the_rank_measures(local_agent):
    """A CPU rank (or any device no collector of the node sees) announces "node-0/cpu-rank1":
    the agent's samples then carry that device's host-bound ratio and memory from the rank's
    own steps, so the Cluster and Memory pages show it instead of "no samples"."""
    server, channel = local_agent
    r0, r1 = Rank(channel, 0), Rank(channel, 1, device_id="node-0/cpu-rank1")
    memory = pb.MemoryProfile(capacity_bytes=64 << 20, used_bytes=24 << 20,
                              host_link_bytes_per_s=1e9, layers=[pb.LayerMemory(
                                  name="layers.0", activation_bytes=1 << 20, forward_s=1e-3,
                                  backward_s=2e-3)])
    r0.step(0, np.ones((2, 4), np.int64))
    r1.step(0, np.ones((2, 4), np.int64), memory=memory)

    def rank_device(s):
        got = {d["device_id"]: d["metrics"] for d in s.api.get("/devices/latest").json()}
        m = got.get("node-0/cpu-rank1") or {}
        return m if m.get("memory_used_bytes") is not None else None

    metrics = server.wait(rank_device, what="samples of the rank-only device")
    assert metrics["host_bound_ratio"] == 0.25
    assert metrics["memory_used_bytes"] == 24 << 20
    assert metrics["memory_total_bytes"] == 64 << 20
    devices = {d["device_id"]: d for d in server.api.get("/devices").json()}
    assert devices["node-0/cpu-rank1"]["rank"] == 1
    r0.close()
    r1.close()


def test_ranks_that_go_away_are_detached_without_an_error_in_the_log(tmp_path, local_agent_process):
    """A rank's stream cancelled, then the agent stopped with the other rank still attached: both
    are detached and the agent exits 0 with no error or traceback in its log."""
    _, agent, channel = local_agent_process
    log = tmp_path / "agent-node-0.log"
    r0, r1 = Rank(channel, 0), Rank(channel, 1)
    wait_until(lambda: log.read_text().count("of job j1 attached") == 2, 20, "both ranks attached")
    r0.call.cancel()
    wait_until(lambda: "rank 0 detached" in log.read_text(), 20, "rank 0 detached")
    assert stop(agent) == 0
    assert "rank 1 detached" in log.read_text()
    r1.close()
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text
