"""Offload messages ↔ ``apply_actions``: pure mapping, no torch and no I/O.

A rank that receives ``pb.OffloadDecision`` (``RankControl.offload``) calls
``actions_of(decision)`` and hands the result to ``apply_actions`` (after ``undo()`` of the
previous handle: a decision's actions are the complete set to have in effect). It then
measures one step, and answers with ``offload_report(decision, step=..., used_bytes=...,
saved_bytes=...)`` (``RankMessage.offload_report``), or with ``error=`` when applying failed.
Its next ``MemoryProfile.applied_actions`` are ``applied_names(decision)``.
"""

from __future__ import annotations

from moeplane.controlplane.memory.types import ActionKind
from moeplane.controlplane.wire import moeplane_pb2 as pb

KINDS = tuple(kind.value for kind in ActionKind)  # in the order the engine defines them
APPLICABLE = ("apply", "relax", "keep")


def actions_of(decision: pb.OffloadDecision) -> list[pb.OffloadAction]:
    """The actions to pass to ``apply_actions`` (each has ``kind`` and ``layers``).

    Raises ValueError naming the field for a verdict that has nothing to apply
    (``cannot_meet``: the control plane never pushes one) or an unknown action kind.
    """
    if decision.verdict not in APPLICABLE:
        raise ValueError(f"decision.verdict: {decision.verdict!r} has nothing to apply "
                         f"(expected one of {', '.join(APPLICABLE)})")
    for i, action in enumerate(decision.actions):
        if action.kind not in KINDS:
            raise ValueError(f"decision.actions[{i}].kind: {action.kind!r} is not one of {', '.join(KINDS)}")
        if not action.layers:
            raise ValueError(f"decision.actions[{i}].layers: must not be empty")
    return list(decision.actions)


def applied_names(decision: pb.OffloadDecision) -> list[str]:
    """``"kind:layer"`` of every action in effect once ``decision`` is applied (profile order)."""
    return [f"{a.kind}:{layer}" for a in decision.actions for layer in a.layers]


def offload_report(
    decision: pb.OffloadDecision, *, step: int, used_bytes: int = 0, saved_bytes: int = 0, error: str = ""
) -> pb.OffloadReport:
    """The report on ``decision``: APPLIED with the measured device peak ``used_bytes`` and the
    bytes ``saved_bytes`` it kept off the device, or FAILED with ``error``."""
    if used_bytes < 0 or saved_bytes < 0:
        raise ValueError(f"used_bytes, saved_bytes: must be >= 0, got {used_bytes}, {saved_bytes}")
    return pb.OffloadReport(
        job_id=decision.job_id, decision_id=decision.decision_id, device_id=decision.device_id,
        state=pb.PLAN_STATE_FAILED if error else pb.PLAN_STATE_APPLIED, step=step,
        measured_used_bytes=0 if error else used_bytes, measured_saved_bytes=0 if error else saved_bytes,
        error=error,
    )


def measured_saving(before, after) -> int:
    """Bytes kept off the device between two ``MemoryReport``s (before and after applying).

    With CUDA peaks on both, the drop in peak; otherwise the drop in saved activations on
    the device plus the growth of optimizer state held on the host. Never negative.
    """
    if before.cuda_peak_bytes is not None and after.cuda_peak_bytes is not None:
        return max(0, before.cuda_peak_bytes - after.cuda_peak_bytes)
    return max(0, before.activation_device_bytes - after.activation_device_bytes
               + after.optimizer_host_bytes - before.optimizer_host_bytes)
