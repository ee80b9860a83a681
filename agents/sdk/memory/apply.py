"""Apply a memory-offload decision to a model's layers, report what it saved, undo it.

``apply_actions(layers, actions, names=..., optimizer=...)`` takes the layers the decision
names (an ``nn.ModuleList``, forward order) and the decision's actions (anything with a
``kind`` — an ``ActionKind`` or its string value — and ``layers``, a sequence of layer names,
e.g. ``moeplane.controlplane.memory.Action``). It replaces chosen entries of ``layers`` in place by
``SwappedLayer`` / ``RecomputedLayer`` wrappers (their parameters are the same objects, so an
optimizer built before keeps working; state_dict keys gain an ``inner.`` prefix while
applied) and offloads optimizer state through ``OptimizerStateOffload``. The returned
``AppliedMemory`` measures and undoes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from moeplane.agents.sdk.memory.meter import SavedTensorMeter, cuda_peak_bytes
from moeplane.agents.sdk.memory.optimizer import OptimizerStateOffload
from moeplane.agents.sdk.memory.recompute import RecomputedLayer
from moeplane.agents.sdk.memory.swap import SwappedLayer
from moeplane.agents.sdk.memory.wire import KINDS
from moeplane.controlplane.memory.types import ActionKind

OFFLOAD_OPTIMIZER = ActionKind.OFFLOAD_OPTIMIZER.value
SWAP_ACTIVATIONS = ActionKind.SWAP_ACTIVATIONS.value
RECOMPUTE = ActionKind.RECOMPUTE.value


@dataclass(frozen=True)
class MemoryReport:
    """What one forward saved, in bytes.

    ``activation_device_bytes``: saved activations left on the device (meter);
    ``activation_host_bytes``: saved activations parked on the host by swapped layers;
    ``optimizer_host_bytes``: optimizer state held on the host;
    ``cuda_peak_bytes``: the CUDA allocator's peak during the measured step (None off CUDA).
    """

    activation_device_bytes: int
    activation_host_bytes: int
    optimizer_host_bytes: int
    cuda_peak_bytes: int | None


def _kind(action: object, i: int) -> str:
    kind = getattr(action, "kind", None)
    kind = getattr(kind, "value", kind)
    if kind not in KINDS:
        raise ValueError(f"actions[{i}].kind: {kind!r} is not one of {', '.join(KINDS)}")
    return kind


class AppliedMemory:
    """The applied actions on ``layers``; ``undo()`` restores the original modules."""

    def __init__(self, layers: nn.ModuleList, originals: dict[int, nn.Module],
                 offload: OptimizerStateOffload | None):
        self.layers = layers
        self._originals = originals
        self.offload = offload

    def swapped(self) -> list[SwappedLayer]:
        return [m for m in self.layers if isinstance(m, SwappedLayer)]

    def measure(self, step) -> MemoryReport:
        """Run ``step()`` (a forward and backward) and report what was kept where."""
        device = next((p.device for p in self.layers.parameters()), torch.device("cpu"))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with SavedTensorMeter(self.layers.modules()) as meter:
            step()
        return MemoryReport(
            activation_device_bytes=meter.device_bytes,
            activation_host_bytes=sum(m.host_bytes for m in self.swapped()),
            optimizer_host_bytes=0 if self.offload is None else self.offload.host_bytes,
            cuda_peak_bytes=cuda_peak_bytes(device),
        )

    def undo(self) -> None:
        for i, module in self._originals.items():
            self.layers[i] = module
        self._originals = {}
        if self.offload is not None:
            self.offload.remove()
            self.offload = None


def apply_actions(
    layers: nn.ModuleList,
    actions: Iterable[object],
    names: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> AppliedMemory:
    """Wrap the layers the actions name; ``names[i]`` names ``layers[i]`` (default ``str(i)``).

    Raises ValueError naming the argument for an unknown layer or kind, a layer given both
    SWAP_ACTIVATIONS and RECOMPUTE, or OFFLOAD_OPTIMIZER without ``optimizer``.
    """
    names = [str(i) for i in range(len(layers))] if names is None else list(names)
    if len(names) != len(layers):
        raise ValueError(f"names: {len(names)} names for {len(layers)} layers")
    index = {name: i for i, name in enumerate(names)}
    wrap: dict[int, str] = {}
    offload_layers: list[int] = []
    for i, action in enumerate(actions):
        kind = _kind(action, i)
        for name in getattr(action, "layers", ()):
            if name not in index:
                raise ValueError(f"actions[{i}].layers: unknown layer {name!r}")
            j = index[name]
            if kind == OFFLOAD_OPTIMIZER:
                offload_layers.append(j)
            elif wrap.setdefault(j, kind) != kind:
                raise ValueError(f"actions[{i}].layers: layer {name!r} cannot both swap and "
                                 "recompute")
    if offload_layers and optimizer is None:
        raise ValueError("optimizer: needed to offload optimizer state")
    originals: dict[int, nn.Module] = {}
    previous_swap: SwappedLayer | None = None
    for j in range(len(layers)):
        if j not in wrap:
            previous_swap = None
            continue
        originals[j] = layers[j]
        if wrap[j] == SWAP_ACTIVATIONS:
            wrapped = SwappedLayer(layers[j])
            wrapped.below = previous_swap  # prefetch the swapped layer right below in backward
            previous_swap = wrapped
        else:
            wrapped = RecomputedLayer(layers[j])
            previous_swap = None
        layers[j] = wrapped
    offload = None
    if offload_layers:
        params = [p for j in sorted(set(offload_layers)) for p in originals.get(j, layers[j])
                  .parameters()]
        offload = OptimizerStateOffload(optimizer, params)
    return AppliedMemory(layers, originals, offload)
