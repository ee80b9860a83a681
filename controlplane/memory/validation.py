"""Validation of the engine's inputs. Every error is an InputError naming the argument."""

from __future__ import annotations

import math
from collections.abc import Sequence

from moeplane.controlplane.memory.types import (
    ActionKind,
    AppliedAction,
    DeviceMemory,
    InputError,
    NodeMemory,
    WatermarkPolicy,
)


def _bytes(value: object, argument: str, *, positive: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(argument, f"must be an integer number of bytes, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InputError(argument, f"must be {'> 0' if positive else '>= 0'}, got {value}")
    return value


def _seconds(value: object, argument: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(argument, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InputError(argument, f"must be finite and {'> 0' if positive else '>= 0'}, got {value}")
    return float(value)


def validate_policy(policy: WatermarkPolicy) -> None:
    if not isinstance(policy, WatermarkPolicy):
        raise InputError("policy", f"must be a WatermarkPolicy, got {type(policy).__name__}")
    for name in ("high_watermark", "low_watermark"):
        value = getattr(policy, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InputError(f"policy.{name}", f"must be a finite number, got {value!r}")
    if not 0 < policy.high_watermark <= 1:
        raise InputError("policy.high_watermark", f"must be in (0, 1], got {policy.high_watermark}")
    if not 0 < policy.low_watermark < policy.high_watermark:
        raise InputError(
            "policy.low_watermark",
            f"must be in (0, high_watermark={policy.high_watermark}), got {policy.low_watermark}",
        )


def validate_nodes(nodes: Sequence[NodeMemory]) -> dict[str, NodeMemory]:
    out: dict[str, NodeMemory] = {}
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, NodeMemory):
            raise InputError(where, f"must be a NodeMemory, got {type(node).__name__}")
        if node.node_id in out:
            raise InputError(f"{where}.node_id", f"duplicate node {node.node_id!r}")
        _bytes(node.free_host_bytes, f"{where}.free_host_bytes")
        out[node.node_id] = node
    return out


def _validate_applied(device: DeviceMemory, where: str, names: set[str]) -> None:
    seen: set[AppliedAction] = set()
    activation_layers: set[str] = set()
    for j, action in enumerate(device.applied):
        arg = f"{where}.applied[{j}]"
        if not isinstance(action, AppliedAction) or not isinstance(action.kind, ActionKind):
            raise InputError(arg, f"must be an AppliedAction with an ActionKind, got {action!r}")
        if action.layer not in names:
            raise InputError(arg, f"unknown layer {action.layer!r} on device {device.device_id!r}")
        if action in seen:
            raise InputError(arg, f"duplicate {action.kind.value} of layer {action.layer!r}")
        seen.add(action)
        if action.kind is not ActionKind.OFFLOAD_OPTIMIZER:
            if action.layer in activation_layers:
                raise InputError(
                    arg, f"layer {action.layer!r} cannot both swap and recompute its activations"
                )
            activation_layers.add(action.layer)


def validate_device(device: DeviceMemory, where: str, nodes: dict[str, NodeMemory]) -> None:
    if not isinstance(device, DeviceMemory):
        raise InputError(where, f"must be a DeviceMemory, got {type(device).__name__}")
    if device.node_id not in nodes:
        raise InputError(f"{where}.node_id", f"unknown node {device.node_id!r} (not in nodes)")
    capacity = _bytes(device.capacity_bytes, f"{where}.capacity_bytes", positive=True)
    used = _bytes(device.used_bytes, f"{where}.used_bytes")
    if used > capacity:
        raise InputError(f"{where}.used_bytes", f"{used} is more than capacity_bytes {capacity}")
    _seconds(device.host_bandwidth_bytes_per_s, f"{where}.host_bandwidth_bytes_per_s", positive=True)
    if device.micro_batch_size is not None and (
        isinstance(device.micro_batch_size, bool)
        or not isinstance(device.micro_batch_size, int)
        or device.micro_batch_size < 1
    ):
        raise InputError(f"{where}.micro_batch_size", f"must be None or >= 1, got {device.micro_batch_size!r}")
    if not device.layers:
        raise InputError(f"{where}.layers", "at least one layer is needed")
    names: set[str] = set()
    for j, layer in enumerate(device.layers):
        arg = f"{where}.layers[{j}]"
        if not isinstance(layer.name, str) or not layer.name:
            raise InputError(f"{arg}.name", f"must be a non-empty string, got {layer.name!r}")
        if layer.name in names:
            raise InputError(f"{arg}.name", f"duplicate layer {layer.name!r}")
        names.add(layer.name)
        for field in ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
                      "input_bytes"):
            _bytes(getattr(layer, field), f"{arg}.{field}")
        if layer.input_bytes > layer.activation_bytes:
            raise InputError(
                f"{arg}.input_bytes",
                f"{layer.input_bytes} is more than activation_bytes {layer.activation_bytes}",
            )
        _seconds(layer.forward_s, f"{arg}.forward_s")
        _seconds(layer.backward_s, f"{arg}.backward_s")
    _validate_applied(device, where, names)


def validate(
    devices: Sequence[DeviceMemory], nodes: Sequence[NodeMemory], policy: WatermarkPolicy
) -> dict[str, NodeMemory]:
    """Check every argument; returns nodes by id. Raises InputError naming the argument."""
    validate_policy(policy)
    by_id = validate_nodes(nodes)
    seen: set[str] = set()
    for i, device in enumerate(devices):
        validate_device(device, f"devices[{i}]", by_id)
        if device.device_id in seen:
            raise InputError(f"devices[{i}].device_id", f"duplicate device {device.device_id!r}")
        seen.add(device.device_id)
    return by_id
