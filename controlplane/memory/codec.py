"""Memory messages ↔ the offload engine's types. Pure: raises WireError naming the bad field.

Up: one device's ``MemoryProfile`` → a ``ProfileRecord`` (ingest checks the node-level
``MemoryProfiles`` around it, :mod:`moeplane.controlplane.ingest.memory`), checked
for what a sender can get wrong (negative bytes, NaN times, a breakdown larger than the
device, a device not of this node, an applied action on an unknown layer) and then against
the engine's own rules, so that whatever is stored can be decided on. ``OffloadReport`` →
the fields ``store.offload.record_report`` takes. Down: a stored decision →
``pb.OffloadDecision``. Also ``device_memory``: a stored profile → the engine's input.

The wire carries no per-layer gradient bytes and no recomputation input bytes: layers get
``gradient_bytes=0`` (the device's gradients are then part of the memory the layers do not
explain, which the engine carries unchanged — gradients are never moved by any action) and
``input_bytes=0`` (recomputation is assumed to keep no checkpoint input on the device).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from moeplane.controlplane.memory import (
    ActionKind,
    AppliedAction,
    DeviceMemory,
    InputError,
    LayerMemory,
    NodeMemory,
    WatermarkPolicy,
)
from moeplane.controlplane.memory.model import build_profile, plan_from_applied
from moeplane.controlplane.memory.records import ProfileRecord
from moeplane.controlplane.memory.validation import validate
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.checks import check_id

MAX_LAYERS = 4096
MAX_NAME = 256
KINDS = {k.value: k for k in ActionKind}
REPORT_STATES = {pb.PLAN_STATE_RECEIVED: "received", pb.PLAN_STATE_APPLIED: "applied",
                 pb.PLAN_STATE_FAILED: "failed"}


def check_bytes(value: int, field: str) -> int:
    if value < 0:
        raise WireError(field, f"must be >= 0 bytes, got {value}")
    return int(value)


def _seconds(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise WireError(field, f"must be a finite number of seconds >= 0, got {value}")
    return float(value)


def parse_applied(items: Iterable[str], names: set[str], field: str) -> tuple[AppliedAction, ...]:
    """``"kind:layer"`` strings → AppliedActions; unknown kinds or layers raise WireError."""
    out: list[AppliedAction] = []
    for j, item in enumerate(items):
        kind, sep, layer = item.partition(":")
        if not sep or kind not in KINDS:
            raise WireError(f"{field}[{j}]", f"{item!r} is not 'kind:layer' with kind one of {', '.join(KINDS)}")
        if layer not in names:
            raise WireError(f"{field}[{j}]", f"unknown layer {layer!r}")
        out.append(AppliedAction(KINDS[kind], layer))
    return tuple(out)


def _layer(msg: pb.LayerMemory, field: str) -> dict:
    if not msg.name or len(msg.name) > MAX_NAME or "," in msg.name:
        raise WireError(f"{field}.name", f"must be 1..{MAX_NAME} characters without commas, got {msg.name!r}")
    return {
        "name": msg.name,
        "activation_bytes": check_bytes(msg.activation_bytes, f"{field}.activation_bytes"),
        "forward_s": _seconds(msg.forward_s, f"{field}.forward_s"),
        "backward_s": _seconds(msg.backward_s, f"{field}.backward_s"),
        "parameter_bytes": check_bytes(msg.parameter_bytes, f"{field}.parameter_bytes"),
        "optimizer_bytes": check_bytes(msg.optimizer_bytes, f"{field}.optimizer_bytes"),
    }


def profile_record(msg: pb.MemoryProfile, field: str, *, job_id: str, node_id: str, step: int,
                   ts: float) -> ProfileRecord:
    """One device's MemoryProfile as a record; WireError (a ValueError) names the bad field
    under ``field``. The node agent runs the same check on each rank's profile, so that one bad
    rank costs only its own profile and not the node's whole message."""
    capacity = check_bytes(msg.capacity_bytes, f"{field}.capacity_bytes")
    if capacity == 0:
        raise WireError(f"{field}.capacity_bytes", "must be > 0")
    used = check_bytes(msg.used_bytes, f"{field}.used_bytes")
    if used > capacity:
        raise WireError(f"{field}.used_bytes", f"{used} is more than capacity_bytes {capacity}")
    parts = {name: check_bytes(getattr(msg, name), f"{field}.{name}")
             for name in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes")}
    if sum(parts.values()) > capacity:
        raise WireError(f"{field}", f"the breakdown (parameters + gradients + optimizer + activations) "
                                    f"{sum(parts.values())} is more than capacity_bytes {capacity}")
    bandwidth = msg.host_link_bytes_per_s
    if not math.isfinite(bandwidth) or bandwidth <= 0:
        raise WireError(f"{field}.host_link_bytes_per_s", f"must be finite and > 0, got {bandwidth}")
    if not msg.layers:
        raise WireError(f"{field}.layers", "at least one layer is needed to decide on offload")
    if len(msg.layers) > MAX_LAYERS:
        raise WireError(f"{field}.layers", f"more than {MAX_LAYERS} layers")
    layers = tuple(_layer(x, f"{field}.layers[{j}]") for j, x in enumerate(msg.layers))
    names = [x["name"] for x in layers]
    if len(set(names)) != len(names):
        raise WireError(f"{field}.layers", "layer names must be unique")
    for part, key in (("parameters_bytes", "parameter_bytes"), ("optimizer_bytes", "optimizer_bytes")):
        total = sum(x[key] for x in layers)
        if total > parts[part]:
            raise WireError(f"{field}.layers", f"the layers' {key} add up to {total}, more than the "
                                               f"device's {part} {parts[part]}")
    parse_applied(msg.applied_actions, set(names), f"{field}.applied_actions")
    return ProfileRecord(
        job_id=job_id, device_id=msg.device_id, node_id=node_id, rank=int(msg.rank), step=step, ts=ts,
        capacity_bytes=capacity, used_bytes=used, host_link_bytes_per_s=float(bandwidth),
        applied_actions=tuple(msg.applied_actions), layers=layers, **parts,
    )


def engine_check(rec: ProfileRecord, host_free: int, field: str) -> None:
    """The engine's own validation of one device, plus its breakdown-within-capacity rule."""
    device = device_memory(rec.__dict__)
    try:
        validate([device], [NodeMemory(rec.node_id, host_free)], WatermarkPolicy())
        modelled = plan_from_applied(build_profile(device, 0), device.applied).peak()
    except InputError as exc:  # the engine names e.g. devices[0].applied[1]: name the wire field
        where = exc.argument.removeprefix("devices[0]").replace(".applied[", ".applied_actions[")
        raise WireError(field + (where if where.startswith(".") else ""), exc.problem) from exc
    if modelled > rec.capacity_bytes:
        raise WireError(f"{field}.layers", f"the layers need {modelled} bytes with the applied actions, "
                                           f"more than capacity_bytes {rec.capacity_bytes}")


def device_memory(profile: dict) -> DeviceMemory:
    """A stored (or just validated) profile → the engine's DeviceMemory (see module doc)."""
    layers = tuple(
        LayerMemory(name=x["name"], parameter_bytes=x["parameter_bytes"], gradient_bytes=0,
                    optimizer_bytes=x["optimizer_bytes"], activation_bytes=x["activation_bytes"],
                    forward_s=x["forward_s"], backward_s=x["backward_s"])
        for x in profile["layers"]
    )
    names = {x.name for x in layers}
    return DeviceMemory(
        device_id=profile["device_id"], node_id=profile["node_id"],
        capacity_bytes=profile["capacity_bytes"], used_bytes=profile["used_bytes"], layers=layers,
        host_bandwidth_bytes_per_s=profile["host_link_bytes_per_s"],
        applied=parse_applied(profile["applied_actions"], names, "applied_actions"),
    )


def report_fields(msg: pb.OffloadReport) -> dict:
    """Validate an OffloadReport's own fields; returns keyword arguments of record_report."""
    if msg.state not in REPORT_STATES:
        raise WireError("offload_report.state", f"unknown state {msg.state}")
    if msg.decision_id <= 0:
        raise WireError("offload_report.decision_id", f"must be positive, got {msg.decision_id}")
    check_id(msg.job_id, "offload_report.job_id")
    check_id(msg.device_id, "offload_report.device_id")
    if msg.step < 0:
        raise WireError("offload_report.step", f"must be >= 0, got {msg.step}")
    check_bytes(msg.measured_used_bytes, "offload_report.measured_used_bytes")
    check_bytes(msg.measured_saved_bytes, "offload_report.measured_saved_bytes")
    state = REPORT_STATES[msg.state]
    if state == "failed" and not msg.error:
        raise WireError("offload_report.error", "a failed report must say why")
    return {
        "job_id": msg.job_id, "device_id": msg.device_id, "state": state, "step": int(msg.step),
        "measured_used_bytes": int(msg.measured_used_bytes),
        "measured_saved_bytes": int(msg.measured_saved_bytes), "error": msg.error[:2000],
    }


def decision_message(decision: dict) -> pb.OffloadDecision:
    """A stored decision → the message pushed to the device's agent."""
    return pb.OffloadDecision(
        job_id=decision["job_id"], decision_id=decision["decision_id"], device_id=decision["device_id"],
        rank=decision["rank"], verdict=decision["verdict"], reason=decision["reason"],
        predicted_peak_bytes=decision["predicted_peak_bytes"],
        actions=[
            pb.OffloadAction(kind=a["kind"], layers=a["layers"], bytes_saved=a["bytes_saved"],
                             host_bytes=a["host_bytes"], overhead_s=a["overhead_s"])
            for a in decision["actions"]
        ],
    )
