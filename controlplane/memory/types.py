"""Inputs and outputs of the memory-offload decision engine, as plain frozen dataclasses.

Units: bytes are Python ``int`` (exact, never rounded), times are ``float`` seconds,
bandwidth is bytes per second. Layers are listed in forward order (index 0 runs first).
Nothing here validates; :mod:`moeplane.controlplane.memory.validation` does that at the entry point.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class InputError(ValueError):
    """An input the engine cannot decide on. ``argument`` names the offending argument."""

    def __init__(self, argument: str, problem: str):
        super().__init__(f"{argument}: {problem}")
        self.argument = argument
        self.problem = problem


class ActionKind(enum.Enum):
    """What an action does to one layer (or one layer's optimizer state)."""

    OFFLOAD_OPTIMIZER = "offload_optimizer"  # Adam moments / master weights live on the host
    SWAP_ACTIVATIONS = "swap_activations"  # saved activations go to host, prefetched in backward
    RECOMPUTE = "recompute"  # saved activations dropped, forward rerun in backward


class Verdict(enum.Enum):
    """What the engine says about one device."""

    APPLY = "apply"  # the peak is over the high watermark; `actions` bring it under
    KEEP = "keep"  # between the watermarks: the applied actions stay as they are
    RELAX = "relax"  # under the low watermark: undo actions and/or grow the micro-batch
    CANNOT_MEET = "cannot_meet"  # no set of actions gets under the high watermark; see reason

    @property
    def changes_something(self) -> bool:
        return self in (Verdict.APPLY, Verdict.RELAX)


@dataclass(frozen=True)
class LayerMemory:
    """Memory and compute of one layer in one training step on one device.

    ``activation_bytes`` is what autograd saves for backward with no action applied (the
    full demand, wherever it is stored now). ``input_bytes`` is what recomputation must keep:
    the layer's input, saved at the checkpoint boundary. Times are this layer's share of one
    step's forward and backward compute on the device.
    """

    name: str
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    forward_s: float
    backward_s: float
    input_bytes: int = 0
    kind: str = "dense"  # "dense" | "moe": informational, the engine treats both alike


@dataclass(frozen=True)
class AppliedAction:
    """An action in effect on the device now (from an earlier decision)."""

    kind: ActionKind
    layer: str


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory snapshot.

    ``used_bytes`` is the measured peak in use during a step with ``applied`` in effect;
    whatever the layers do not explain (workspace, allocator cache, communication buffers)
    is carried unchanged into every prediction. ``micro_batch_size`` (optional) lets a
    RELAX verdict name the larger micro-batch it suggests.
    """

    device_id: str
    node_id: str
    capacity_bytes: int
    used_bytes: int
    layers: tuple[LayerMemory, ...]
    host_bandwidth_bytes_per_s: float
    applied: tuple[AppliedAction, ...] = ()
    micro_batch_size: int | None = None


@dataclass(frozen=True)
class NodeMemory:
    """Host memory of one node, shared by the devices on it.

    ``free_host_bytes`` is measured now, so host memory held by actions already applied on
    the node's devices is not in it; the engine adds that back before planning.
    """

    node_id: str
    free_host_bytes: int


@dataclass(frozen=True)
class WatermarkPolicy:
    """Watermarks as fractions of device capacity, ``0 < low < high <= 1``."""

    high_watermark: float = 0.90
    low_watermark: float = 0.70


@dataclass(frozen=True)
class Action:
    """One kind of action over the layers it applies to.

    ``device_bytes_freed``: bytes this action keeps off the device while in effect (the
    sum over its layers; the drop in the *peak* can be smaller, see ``OffloadDecision``).
    ``host_bytes``: pinned host memory it holds. ``overhead_s``: its share of the predicted
    step-time overhead (the shares of a decision's actions add up to its ``overhead_s``).
    """

    kind: ActionKind
    layers: tuple[str, ...]
    device_bytes_freed: int
    host_bytes: int
    overhead_s: float
    prefetch: bool = False  # SWAP_ACTIVATIONS: fetched back ahead of the layer's backward


@dataclass(frozen=True)
class OffloadDecision:
    """The engine's answer for one device.

    ``actions`` is the complete set that should be in effect after this decision (not a
    delta); ``undo`` lists applied actions that are no longer in it. Peaks are predicted
    bytes: ``peak_now_bytes`` with ``applied``, ``peak_after_bytes`` with ``actions``.
    For CANNOT_MEET, ``actions`` is empty and ``reason`` says which constraint failed.
    """

    device_id: str
    node_id: str
    verdict: Verdict
    actions: tuple[Action, ...]
    undo: tuple[AppliedAction, ...]
    peak_now_bytes: int
    peak_after_bytes: int
    high_watermark_bytes: int
    low_watermark_bytes: int
    host_bytes: int
    overhead_s: float
    reason: str
    micro_batch_factor: float | None = None  # RELAX: activations may grow by this factor
    suggested_micro_batch_size: int | None = None
    method: str = ""  # which search produced `actions` (greedy, pruned baseline, ...)
