"""Device memory of a simulated rank: what its ``MemoryProfile`` says, and what offload does.

Pure and seeded: no I/O, no clock. The sizes follow from the model's shape and micro-batch:
each rank holds ``L`` MoE layers of width ``hidden`` with ``S`` expert slots of inner width
``expert_ffn`` (a :class:`moeplane.controlplane.memory.synthetic.StackShape`, whose
``layer_profiles`` does the accounting: bf16 weights and gradients, fp32 master weights and
Adam moments over ``zero_shards`` ranks, activations after Korthikanti et al. 2022 with
expert buffers sized for a balanced share (a capacity factor), compute time from FLOPs).

A longer-sequence phase multiplies the sequence length of a few ranks (``seq_factor``), so
their activations grow; never past :data:`MAX_FILL` of the capacity without offload (the rank
would run out of memory).

The device peak with the offload actions in effect is the control plane's own cost model
(:mod:`moeplane.controlplane.memory.model`, the simulator's physics) plus the rank's workspace
(communication buffers, allocator cache) and Gaussian noise. So a decision lowers the peak by
what it predicted, up to the noise. Bytes are bytes, times seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from moeplane.controlplane.memory import (
    ActionKind,
    AppliedAction,
    DeviceMemory,
    InputError,
    LayerMemory,
    NodeMemory,
)
from moeplane.controlplane.memory.model import Plan, build_profile, plan_from_applied
from moeplane.controlplane.memory.synthetic import StackShape, layer_profiles
from moeplane.controlplane.memory.validation import validate_device
from moeplane.controlplane.wire import moeplane_pb2 as pb

GIB = 1 << 30
MAX_FILL = 0.985


@dataclass(frozen=True)
class MemorySpec:
    """The model's widths and micro-batch, and the device (see the module docstring).

    hidden, expert_ffn: widths. seq_len, micro_batch: tokens per micro-batch. zero_shards:
    ranks the optimizer state is sharded over. flops_per_s: effective compute speed (the
    default makes a step's compute about 0.75 s, like the simulator's 1 s steps).
    capacity_bytes: device memory. workspace_bytes: memory the layers do not explain.
    host_link_bytes_per_s: host<->device copy bandwidth. noise_bytes: std of the peak.
    """

    hidden: int = 5120
    expert_ffn: int = 2560
    seq_len: int = 4096
    micro_batch: int = 1
    zero_shards: int = 1
    flops_per_s: float = 1.2e14
    capacity_bytes: int = 80 * GIB
    workspace_bytes: int = 3 * GIB
    host_link_bytes_per_s: float = 25e9
    noise_bytes: int = 96 << 20

    def __post_init__(self) -> None:
        for name in ("hidden", "expert_ffn", "seq_len", "micro_batch", "zero_shards",
                     "flops_per_s", "capacity_bytes", "host_link_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("workspace_bytes", "noise_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")

    def stack(self, layers: int, slots: int, top_k: int) -> StackShape:
        """The stack one rank runs: ``layers`` MoE layers, ``slots`` experts each."""
        return StackShape(name="sim", hidden=self.hidden, seq=self.seq_len,
                          micro_batch=self.micro_batch, layers=layers, ffn=0, moe_every=1,
                          experts_per_device=slots, expert_ffn=self.expert_ffn, top_k=top_k,
                          zero_shards=self.zero_shards, flops_per_s=self.flops_per_s)


@dataclass(frozen=True)
class Measured:
    """One step's memory on one rank: ``layers`` as the profile reports them, ``plan`` the
    cost model's plan with the actions in effect, ``used_bytes`` the measured peak."""

    layers: tuple[LayerMemory, ...]
    plan: Plan
    used_bytes: int

    @property
    def activation_peak_bytes(self) -> int:
        return max(self.plan.sweep())


def applied_actions(decision: pb.OffloadDecision, names: Sequence[str]) -> tuple[AppliedAction, ...]:
    """The complete set of actions a decision asks for; ValueError names a bad field."""
    kinds = {k.value: k for k in ActionKind}
    out: list[AppliedAction] = []
    for i, action in enumerate(decision.actions):
        if action.kind not in kinds:
            raise ValueError(f"decision.actions[{i}].kind: unknown {action.kind!r}")
        out.extend(AppliedAction(kinds[action.kind], layer) for layer in action.layers)
    device = DeviceMemory(device_id=decision.device_id, node_id="node", capacity_bytes=1,
                          used_bytes=0, host_bandwidth_bytes_per_s=1.0, applied=tuple(out),
                          layers=tuple(LayerMemory(x, 0, 0, 0, 0, 0.0, 0.0) for x in names))
    try:  # the engine's own rules: known layers, no duplicate, no swap and recompute of one layer
        validate_device(device, "decision", {"node": NodeMemory("node", 0)})
    except InputError as exc:
        raise ValueError(f"decision.actions ({exc.argument}): {exc.problem}") from None
    return tuple(out)


class RankMemory:
    """The memory of one simulated rank and the offload decision in effect on it.

    ``submit`` keeps the newest decision pushed; ``step`` applies it at the next step boundary
    and reports it (APPLIED with the peak it measured in that step, or FAILED).
    """

    def __init__(self, spec: MemorySpec, *, layers: int, slots: int, top_k: int,
                 rng: np.random.Generator):
        self.spec = spec
        self.shape = spec.stack(layers, slots, top_k)
        self.names = [x.name for x in layer_profiles(self.shape)]
        self.rng = rng
        self.workspace = int(spec.workspace_bytes * rng.uniform(0.9, 1.1))
        self.applied: tuple[AppliedAction, ...] = ()
        self.decision_id = 0  # the newest decision taken (0: none)
        self.pending: pb.OffloadDecision | None = None
        self.last: Measured | None = None

    def submit(self, decision: pb.OffloadDecision) -> bool:
        """Keep ``decision`` for the next step boundary; False for an older or known one."""
        newest = max(self.decision_id, self.pending.decision_id if self.pending else 0)
        if decision.decision_id <= newest:
            return False
        self.pending = decision
        return True

    def step(self, seq_factor: float = 1.0) -> tuple[Measured, pb.OffloadReport | None]:
        """Run one step, applying a pending decision first; returns what it measured and the
        report of a decision taken at this step."""
        decision, self.pending = self.pending, None
        before = self.last.used_bytes if self.last is not None else None
        error = ""
        if decision is not None:
            self.decision_id = decision.decision_id
            try:
                self.applied = applied_actions(decision, self.names)
            except ValueError as exc:
                error = str(exc)
        self.last = measured = self.measure(seq_factor)
        if decision is None:
            return measured, None
        report = pb.OffloadReport(job_id=decision.job_id, decision_id=decision.decision_id,
                                  device_id=decision.device_id)
        if error:
            report.state, report.error = pb.PLAN_STATE_FAILED, error
        else:
            report.state = pb.PLAN_STATE_APPLIED
            report.measured_used_bytes = measured.used_bytes
            report.measured_saved_bytes = max(0, (before or 0) - measured.used_bytes)
        return measured, report

    def _plan(self, seq_factor: float, applied: tuple[AppliedAction, ...]) -> tuple[tuple, Plan]:
        shape = replace(self.shape, seq=max(1, round(self.shape.seq * seq_factor)))
        layers = layer_profiles(shape)
        device = DeviceMemory("rank", "node", self.spec.capacity_bytes, 0, layers,
                              self.spec.host_link_bytes_per_s, applied)
        return layers, plan_from_applied(build_profile(device, self.workspace), applied)

    def demand(self, seq_factor: float = 1.0) -> int:
        """The peak without offload (bytes, no noise)."""
        return self._plan(seq_factor, ())[1].peak()

    def fits(self) -> bool:
        """Whether the stack runs without offload within :data:`MAX_FILL` of the capacity."""
        return self.demand() <= MAX_FILL * self.spec.capacity_bytes

    def fitting(self, seq_factor: float) -> float:
        """The largest factor up to ``seq_factor`` whose peak without offload stays within
        :data:`MAX_FILL` of the capacity (a longer sequence would run out of memory)."""
        limit = MAX_FILL * self.spec.capacity_bytes
        if seq_factor <= 1.0 or self.demand(seq_factor) <= limit:
            return seq_factor
        lo, hi = 1.0, seq_factor
        for _ in range(16):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.demand(mid) <= limit else (lo, mid)
        return lo

    def measure(self, seq_factor: float = 1.0) -> Measured:
        """This step's layers and peak with the actions in effect."""
        spec = self.spec
        layers, plan = self._plan(self.fitting(seq_factor), self.applied)
        noise = self.rng.normal(0.0, spec.noise_bytes) if spec.noise_bytes else 0.0
        used = int(min(spec.capacity_bytes, max(0.0, plan.peak() + noise)))
        return Measured(layers, plan, used)

    def profile(self, measured: Measured, device_id: str, rank: int) -> pb.MemoryProfile:
        """The ``MemoryProfile`` a rank sends for ``measured`` (the SDK's fields)."""
        layers = measured.layers
        return pb.MemoryProfile(
            device_id=device_id, rank=rank, capacity_bytes=self.spec.capacity_bytes,
            used_bytes=measured.used_bytes,
            parameters_bytes=sum(x.parameter_bytes for x in layers),
            gradients_bytes=sum(x.gradient_bytes for x in layers),
            optimizer_bytes=sum(x.optimizer_bytes for x in layers),
            activations_peak_bytes=measured.activation_peak_bytes,
            layers=[pb.LayerMemory(name=x.name, activation_bytes=x.activation_bytes,
                                   forward_s=x.forward_s, backward_s=x.backward_s,
                                   parameter_bytes=x.parameter_bytes,
                                   optimizer_bytes=x.optimizer_bytes, input_bytes=x.input_bytes,
                                   gradient_bytes=x.gradient_bytes) for x in layers],
            host_link_bytes_per_s=self.spec.host_link_bytes_per_s,
            applied_actions=[f"{a.kind.value}:{a.layer}" for a in self.applied],
            micro_batch_size=self.spec.micro_batch,
        )
