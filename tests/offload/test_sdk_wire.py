"""A pushed OffloadDecision applied through the SDK on a CPU model, and the report it makes."""

from __future__ import annotations

import pytest

from moeplane.controlplane.wire import moeplane_pb2 as pb

pytestmark = pytest.mark.torch


def decision(*actions: tuple[str, list[str]], verdict: str = "apply") -> pb.OffloadDecision:
    return pb.OffloadDecision(
        job_id="job-1", decision_id=7, device_id="node-0/gpu0", rank=0, verdict=verdict,
        actions=[pb.OffloadAction(kind=k, layers=layers, bytes_saved=1) for k, layers in actions],
        predicted_peak_bytes=100,
    )


def test_decision_applies_and_reports_what_it_saved():
    import torch
    from torch import nn

    from moeplane.agents.sdk.memory import apply_actions
    from moeplane.agents.sdk.memory.wire import (
        actions_of,
        applied_names,
        measured_saving,
        offload_report,
    )

    torch.manual_seed(0)
    layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(3))
    names = [f"layers.{i}" for i in range(3)]
    optimizer = torch.optim.Adam(layers.parameters(), lr=1e-3)
    x = torch.randn(16, 32)

    def step():
        optimizer.zero_grad(set_to_none=True)
        h = x
        for layer in layers:
            h = layer(h)
        h.pow(2).mean().backward()
        optimizer.step()

    plain = apply_actions(layers, [], names=names, optimizer=optimizer)
    before = plain.measure(step)
    plain.undo()
    d = decision(("offload_optimizer", ["layers.0", "layers.1"]), ("swap_activations", ["layers.1"]),
                 ("recompute", ["layers.2"]))
    handle = apply_actions(layers, actions_of(d), names=names, optimizer=optimizer)
    after = handle.measure(step)
    saved = measured_saving(before, after)
    assert after.activation_device_bytes < before.activation_device_bytes
    assert after.optimizer_host_bytes > 0 and saved > 0
    report = offload_report(d, step=5, used_bytes=1000, saved_bytes=saved)
    assert (report.decision_id, report.device_id, report.job_id) == (7, "node-0/gpu0", "job-1")
    assert report.state == pb.PLAN_STATE_APPLIED and report.measured_saved_bytes == saved
    assert applied_names(d) == ["offload_optimizer:layers.0", "offload_optimizer:layers.1",
                                "swap_activations:layers.1", "recompute:layers.2"]
    handle.undo()
    failed = offload_report(d, step=5, used_bytes=1000, error="layer missing")
    assert failed.state == pb.PLAN_STATE_FAILED and failed.measured_used_bytes == 0


def test_bad_decisions_name_the_field():
    from moeplane.agents.sdk.memory.wire import actions_of, offload_report

    with pytest.raises(ValueError, match=r"^decision.verdict: 'cannot_meet'"):
        actions_of(decision(verdict="cannot_meet"))
    with pytest.raises(ValueError, match=r"^decision.actions\[0\].kind: 'defrag'"):
        actions_of(decision(("defrag", ["layers.0"])))
    with pytest.raises(ValueError, match=r"^decision.actions\[0\].layers"):
        actions_of(decision(("recompute", [])))
    with pytest.raises(ValueError, match=r"^used_bytes, saved_bytes"):
        offload_report(decision(), step=1, used_bytes=-1)
