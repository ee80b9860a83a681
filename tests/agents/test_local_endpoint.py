"""NodeLocal over the agent's Unix socket: validation, aggregation upward, plan fan-out."""

from __future__ import annotations

import queue
import threading

import grpc
import numpy as np
import pytest

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc
from moeplane.controlplane.wire.arrays import decode_array, encode_array

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
        self.responses = Controls(pb_grpc.NodeLocalStub(channel).Attach(
            iter(self.outbox.get, None)), rank)

    def step(self, step: int, counts: np.ndarray, memory: pb.MemoryProfile | None = None) -> None:
        self.outbox.put(pb.RankMessage(step=pb.RankStep(
            step=step, counts=encode_array(counts), timestamp=1.7e9, memory=memory,
            stats=pb.RankStepStats(rank=0, step_time_s=0.5, host_bound_ratio=0.25, tokens=9))))

    def close(self) -> None:
        self.outbox.put(None)


def test_bad_step_is_rejected_on_the_stream_and_good_steps_are_summed(local_agent):
    ingest, channel = local_agent
    r0, r1 = Rank(channel, 0), Rank(channel, 1)
    r0.step(0, np.ones((3, 4), np.int64))  # wrong [L, E]
    ack = next(r0.responses).ack
    assert ack.code == 3 and "step.counts.shape" in ack.message and ack.seq == 0
    r0.step(0, np.full((2, 4), 2, np.int64))  # the stream survived
    r1.step(0, np.full((2, 4), 5, np.int64))
    loads = ingest.wait_for(lambda s: s.loads.get(("j1", "node-0", 0)))
    assert list(loads.ranks) == [0, 1]
    assert (decode_array(loads.counts, "c", shape=(2, 4)) == 7).all()
    samples = ingest.wait_for(lambda s: [m.samples for m in s.stored.values()
                                         if m.WhichOneof("body") == "samples"
                                         and "host_bound_ratio" in m.samples.metrics])
    hb = decode_array(samples[-1].values, "v", finite=False)[
        :, list(samples[-1].metrics).index("host_bound_ratio")]
    assert hb[0] == 0.25 and hb[1] == 0.25 and np.isnan(hb[2:]).all()
    plan = pb.PlacementPlan(job_id="j1", epoch=2, slots_per_rank=2,
                            phy2log=encode_array(np.zeros((2, 4), np.int64)))
    ingest.send_plan(plan)
    assert next(r1.responses).plan.epoch == 2
    assert next(r0.responses).plan.epoch == 2
    for r in (r0, r1):
        r.outbox.put(pb.RankMessage(plan_report=pb.PlanReport(
            job_id="j1", epoch=2, state=pb.PLAN_STATE_APPLIED, step=12)))
    report = ingest.wait_for(lambda s: [m.plan_report for m in s.stored.values()
                                        if m.WhichOneof("body") == "plan_report"
                                        and m.plan_report.state == pb.PLAN_STATE_APPLIED])
    assert (report[0].epoch, report[0].step) == (2, 12) and len(report) == 1
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
    ingest, channel = local_agent

    def rank_of(device: str):
        return lambda s: s.hellos and {d.device_id: d.rank for d in s.hellos[-1].devices}.get(device)

    r0 = Rank(channel, 0)
    ingest.wait_for(lambda s: rank_of("node-0/gpu0")(s) == 0)
    r1 = Rank(channel, 1)
    ingest.wait_for(lambda s: rank_of("node-0/gpu1")(s) == 1)
    assert ingest.snapshot(lambda s: [d.rank for d in s.hellos[-1].devices][:2]) == [0, 1]
    r0.close()
    r1.close()
