"""The reporter against a tiny real NodeLocal gRPC server on a Unix socket."""

from __future__ import annotations

import queue
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from moeplane.agents.sdk.reporter import Reporter, memory_breakdown
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc
from moeplane.controlplane.wire.arrays import decode_array, encode_array

pytestmark = pytest.mark.torch
JOB = pb.JobSpec(job_id="job", layers=2, experts=4, top_k=2, world_size=1, slots_per_rank=4)
DEADLINE = 10.0


class Agent(pb_grpc.NodeLocalServicer):
    """Records every RankMessage; writes what is put in ``outbox`` down the latest stream."""

    def __init__(self):
        self.messages: list[pb.RankMessage] = []
        self.streams_ended = 0
        self.cond = threading.Condition()
        self.outbox: queue.Queue = queue.Queue()

    def Attach(self, request_iterator, context):  # noqa: N802 - gRPC method name
        def read():
            for msg in request_iterator:
                with self.cond:
                    self.messages.append(msg)
                    self.cond.notify_all()
            with self.cond:
                self.streams_ended += 1
                self.cond.notify_all()
            self.outbox.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (item := self.outbox.get()) is not None:
            yield item

    def wait(self, predicate) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), DEADLINE), self.messages

    def of(self, body: str) -> list:
        with self.cond:
            return [getattr(m, body) for m in self.messages if m.WhichOneof("body") == body]


def serve(path: str) -> tuple[grpc.Server, Agent]:
    agent = Agent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_NodeLocalServicer_to_server(agent, server)
    assert server.add_insecure_port(f"unix:{path}") != 0
    server.start()
    return server, agent


@pytest.fixture
def socket_path(tmp_path) -> str:
    return str(tmp_path / "agent.sock")


def test_steps_reach_the_agent_and_plans_come_back(socket_path):
    server, agent = serve(socket_path)
    plans: list[pb.PlacementPlan] = []
    got_plan = threading.Event()
    counter = torch.zeros(2, 4, dtype=torch.int64)
    reporter = Reporter(counter, rank=3, job=JOB, socket_path=socket_path, device_id="n/gpu3",
                        on_plan=lambda p: (plans.append(p), got_plan.set())).start()
    try:
        counter += torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
        reporter.end_step(0, tokens=18)
        assert int(counter.sum()) == 0  # reset for the next step
        counter[1, 3] += 9
        reporter.end_step(1, tokens=9)
        agent.wait(lambda a: len(a.of("step")) == 2)
        hello = agent.of("hello")
        assert len(hello) == 1 and hello[0].rank == 3 and hello[0].device_id == "n/gpu3"
        assert hello[0].job == JOB
        assert agent.messages[0].WhichOneof("body") == "hello"
        steps = agent.of("step")
        assert [s.step for s in steps] == [0, 1]
        np.testing.assert_array_equal(
            decode_array(steps[0].counts, "counts"), [[1, 2, 3, 4], [5, 6, 7, 8]]
        )
        np.testing.assert_array_equal(
            decode_array(steps[1].counts, "counts"), [[0, 0, 0, 0], [0, 0, 0, 9]]
        )
        assert steps[0].stats.rank == 3 and steps[0].stats.tokens == 18
        assert steps[1].stats.step_time_s > 0 and 0 <= steps[1].stats.host_bound_ratio <= 1

        plan = pb.PlacementPlan(job_id="job", epoch=2, slots_per_rank=4,
                                phy2log=encode_array(np.zeros((2, 4), dtype=np.int64)))
        agent.outbox.put(pb.RankControl(plan=plan))
        assert got_plan.wait(DEADLINE)
        assert plans == [plan]
        reporter.send_report(pb.PlanReport(job_id="job", epoch=2, state=pb.PLAN_STATE_APPLIED,
                                           step=5))
        agent.wait(lambda a: len(a.of("plan_report")) == 1)
        assert agent.of("plan_report")[0].step == 5
    finally:
        reporter.close()
        server.stop(None)
    agent.wait(lambda a: a.streams_ended == 1)  # close ends the stream cleanly
    assert reporter.dropped == 0


def test_steps_queued_while_the_agent_is_away_arrive_once_it_starts(socket_path):
    counter = torch.zeros(2, 4, dtype=torch.int64)
    reporter = Reporter(counter, rank=0, job=JOB, socket_path=socket_path, max_pending=4).start()
    try:
        for step in range(6):  # nobody listens: the step never blocks, the oldest are dropped
            counter[0, 0] += step
            reporter.end_step(step)
        assert reporter.dropped == 2
        server, agent = serve(socket_path)
        try:
            agent.wait(lambda a: len(a.of("step")) == 4)
            steps = agent.of("step")
            assert [s.step for s in steps] == [2, 3, 4, 5]
            assert [int(decode_array(s.counts, "c")[0, 0]) for s in steps] == [2, 3, 4, 5]
        finally:
            reporter.close()
            server.stop(None)
    finally:
        reporter.close()


def test_host_bound_ratio_on_cpu_is_the_share_of_the_step_in_host_regions():
    ticks = iter([0.0, 0.0, 1.0, 4.0, 10.0, 20.0])  # init, start, region 1..4, end 10 and 20
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB,
                        perf=lambda: next(ticks)).start()
    with reporter.host_region():
        pass
    reporter.end_step(0)
    assert reporter.last["step_time_s"] == 10.0
    assert reporter.last["host_bound_ratio"] == pytest.approx(0.3)
    reporter.end_step(1)
    assert reporter.last["host_bound_ratio"] == 0.0  # regions count for their own step only
    reporter.close()


def test_memory_breakdown_counts_parameters_gradients_state_and_activations():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters())
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB, model=model,
                        optimizer=opt).start()
    params = sum(p.numel() for p in model.parameters()) * 4
    with reporter.activations():
        model(torch.randn(32, 8)).square().sum().backward()
    opt.step()
    reporter.end_step(0)
    mem = reporter.memory
    assert mem["parameters"] == params
    assert mem["gradients"] == params
    # exp_avg + exp_avg_sq per parameter, plus one float32 step counter per parameter tensor
    assert mem["optimizer_state"] == 2 * params + 4 * 4
    # saved for backward (torch 2.13): the input, the ReLU output, the output for square()
    assert mem["activation_peak"] == (32 * 8 + 32 * 16 + 32 * 4) * 4
    assert memory_breakdown(model) == {**{k: mem[k] for k in ("parameters", "gradients")},
                                       "optimizer_state": 0}
    reporter.close()


def test_counter_shape_must_match_the_job():
    with pytest.raises(ValueError, match="counter"):
        Reporter(torch.zeros(3, 4, dtype=torch.int64), rank=0, job=JOB)
