"""The SDK's half of the offload loop on a tiny CPU model: per-layer profiles in RankStep.memory,
a pushed decision applied at a step boundary and reported with the bytes it saved, a bad one
reported FAILED with everything undone."""

from __future__ import annotations

import pytest
import torch

from moeplane.agents.offload import check_profile
from moeplane.agents.sdk.memory.swap import SwappedLayer
from moeplane.agents.sdk.reporter import Reporter
from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests.sdk.memory_net import NAMES, build
from tests.sdk.test_reporter import JOB, serve

pytestmark = pytest.mark.torch
WIDTH, BATCH = 64, 32


def setup(**kw):
    return build(WIDTH, BATCH, profile_interval_s=0.0, **kw)


def train_step(reporter: Reporter, net, opt, step: int) -> None:
    x = torch.randn(BATCH, 8, generator=torch.Generator().manual_seed(step))
    with reporter.activations():
        loss = net(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    opt.step()
    reporter.end_step(step)


def test_the_profile_breaks_memory_down_per_layer():
    net, opt, offload = setup()
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB, offload=offload)
    for step in range(2):
        train_step(reporter, net, opt, step)
    p = offload.profile("n/cpu0", 0)
    check_profile(p)  # what the agent checks before sending it up
    layer_params = sum(x.numel() * 4 for x in net.layers[0].parameters())
    assert [x.name for x in p.layers] == NAMES
    for x in p.layers:
        assert x.parameter_bytes == x.gradient_bytes == layer_params
        assert x.optimizer_bytes == 2 * layer_params + 4 * len(list(net.layers[0].parameters()))
        # saved for backward, [BATCH, WIDTH] fp32 each: the layer's input (by the first
        # Linear), the GELU's input and the second Linear's input
        assert x.activation_bytes == 3 * BATCH * WIDTH * 4
        assert x.input_bytes == BATCH * WIDTH * 4
        assert x.forward_s > 0 and x.backward_s > 0
    all_params = sum(x.numel() * 4 for x in net.parameters())
    assert (p.parameters_bytes, p.gradients_bytes) == (all_params, all_params)
    assert p.activations_peak_bytes >= sum(x.activation_bytes for x in p.layers)
    assert p.used_bytes == (p.parameters_bytes + p.gradients_bytes + p.optimizer_bytes
                            + p.activations_peak_bytes)
    assert p.host_link_bytes_per_s > 0 and p.micro_batch_size == BATCH
    assert p.device_id == "n/cpu0" and list(p.applied_actions) == []
    offload.close()


def decision(decision_id: int, *actions: tuple[str, list[str]]) -> pb.OffloadDecision:
    return pb.OffloadDecision(job_id="job", decision_id=decision_id, device_id="n/cpu0",
                              verdict="apply", actions=[pb.OffloadAction(kind=k, layers=names)
                                                        for k, names in actions])


def test_a_pushed_decision_is_applied_at_a_boundary_and_its_saving_reported(tmp_path):
    server, agent = serve(str(tmp_path / "agent.sock"))
    net, opt, offload = setup()
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB,
                        socket_path=str(tmp_path / "agent.sock"), device_id="n/cpu0",
                        offload=offload).start()
    try:
        for step in range(2):
            train_step(reporter, net, opt, step)
        agent.wait(lambda a: len(a.of("step")) == 2)
        before = agent.of("step")[-1].memory
        d = decision(7, ("swap_activations", ["layers.0", "layers.1"]),
                     ("recompute", ["layers.2"]), ("offload_optimizer", ["layers.3"]))
        agent.outbox.put(pb.RankControl(offload=d))
        agent.outbox.put(pb.RankControl(offload=d))  # resent after a hello: handled once
        step = 2
        while not offload.reports:  # the decision arrives on the receive thread
            train_step(reporter, net, opt, step)
            step += 1
            assert step < 200, "the decision never arrived"
        train_step(reporter, net, opt, step)
        agent.wait(lambda a: len(a.of("offload_report")) == 1 and len(a.of("step")) == step + 1)
        [report] = agent.of("offload_report")
        after = agent.of("step")[-1].memory
    finally:
        reporter.close()
        server.stop(None)
    assert isinstance(net.layers[0], SwappedLayer) and isinstance(net.layers[1], SwappedLayer)
    assert (report.decision_id, report.device_id, report.state) == (7, "n/cpu0",
                                                                    pb.PLAN_STATE_APPLIED)
    layer = 3 * BATCH * WIDTH * 4
    opt3 = before.layers[3].optimizer_bytes
    # layers 0-1 swapped all they saved, layer 2 keeps only its input for the recomputation,
    # layer 3's optimizer state went to the host
    kept_input = before.layers[2].input_bytes
    assert report.measured_saved_bytes == 3 * layer - kept_input + opt3
    assert report.measured_used_bytes == before.used_bytes - report.measured_saved_bytes
    assert after.used_bytes == report.measured_used_bytes
    assert sorted(after.applied_actions) == sorted(
        ["swap_activations:layers.0", "swap_activations:layers.1", "recompute:layers.2",
         "offload_optimizer:layers.3"])
    # the layers still say what they need without the actions
    assert [x.activation_bytes for x in after.layers] == [x.activation_bytes
                                                          for x in before.layers]
    check_profile(after)


def test_a_decision_that_cannot_be_applied_is_reported_failed_with_everything_undone():
    net, opt, offload = setup()
    originals = list(net.layers)
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB, offload=offload)
    train_step(reporter, net, opt, 0)
    assert offload.submit(decision(3, ("swap_activations", ["layers.0"])))
    train_step(reporter, net, opt, 1)
    assert offload.applied() == ["swap_activations:layers.0"]
    assert offload.submit(decision(4, ("recompute", ["layers.9"])))
    assert not offload.submit(decision(2, ("recompute", ["layers.1"])))  # older than in effect
    train_step(reporter, net, opt, 2)
    failed = offload.reports[-1]
    assert failed.decision_id == 4 and failed.state == pb.PLAN_STATE_FAILED
    assert "unknown layer 'layers.9'" in failed.error and failed.step == 3
    assert list(net.layers) == originals and offload.applied() == []
    offload.close()


def test_a_model_can_refuse_recomputation():
    net, opt, offload = setup(kinds=("swap_activations", "offload_optimizer"))
    reporter = Reporter(torch.zeros(2, 4, dtype=torch.int64), rank=0, job=JOB, offload=offload)
    train_step(reporter, net, opt, 0)
    offload.submit(decision(5, ("swap_activations", ["layers.0"]), ("recompute", ["layers.1"])))
    train_step(reporter, net, opt, 1)
    assert offload.reports[-1].state == pb.PLAN_STATE_FAILED
    assert "decision.actions[1].kind: 'recompute' is not allowed" in offload.reports[-1].error
    assert offload.applied() == [] and not any(isinstance(m, SwappedLayer) for m in net.layers)
    offload.close()
