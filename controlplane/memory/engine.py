"""``decide_offload``: the entry point of the memory-offload decision engine.

Per device, with ``high`` and ``low`` the watermarks in bytes and ``peak_now`` the predicted
peak with the actions applied now (see :mod:`moeplane.controlplane.memory.model`):

- ``peak_now > high``: APPLY the cheapest plan found (:mod:`moeplane.controlplane.memory.search`) that
  brings the peak to ``<= high``, or CANNOT_MEET with the reason;
- ``low <= peak_now <= high``: KEEP (the band between the watermarks stops flapping);
- ``peak_now < low``: RELAX: the cheapest plan under ``high``, which undoes the applied
  actions no longer needed; with no action needed at all, a larger micro-batch: activations
  scale linearly with it, so they may grow by ``(high - static) / activation_peak``.

Host memory is shared per node: the budget is the node's free host memory plus what the
applied actions of its devices hold now. Devices that KEEP hold what they hold; the others
are planned together. If their cheapest plans need more host memory than the budget, host
memory gets a price (seconds of overhead per byte) found by bisection, the smallest at which
the plans fit: this minimises the sum of the devices' overheads for the host memory there is
(Lagrangian relaxation, heuristic). If even the highest price does not fit them, devices get
host memory in order of need (smallest first, then device id) and the rest CANNOT_MEET.
Deterministic; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moeplane.controlplane.memory.model import Plan, Profile, build_profile, plan_from_applied
from moeplane.controlplane.memory.search import (
    SearchResult,
    recompute_everything,
    search,
    swap_everything,
)
from moeplane.controlplane.memory.types import (
    Action,
    ActionKind,
    DeviceMemory,
    InputError,
    NodeMemory,
    OffloadDecision,
    Verdict,
    WatermarkPolicy,
)
from moeplane.controlplane.memory.validation import validate

PRICE_HIGH = 1.0  # seconds per host byte: above any overhead a byte of host memory can save
PRICE_LOW = 1e-18
BISECTIONS = 20
KIND_ORDER = (ActionKind.OFFLOAD_OPTIMIZER, ActionKind.SWAP_ACTIVATIONS, ActionKind.RECOMPUTE)


@dataclass
class _Device:
    device: DeviceMemory
    profile: Profile
    current: Plan
    peak_now: int
    high: int
    low: int


def _prepare(device: DeviceMemory, where: str, policy: WatermarkPolicy) -> _Device:
    bare = build_profile(device, 0)
    modelled = plan_from_applied(bare, device.applied).peak()
    if modelled > device.capacity_bytes:
        raise InputError(
            f"{where}.layers",
            f"the breakdown needs {modelled} bytes with the applied actions, more than "
            f"capacity_bytes {device.capacity_bytes}",
        )
    profile = build_profile(device, max(0, device.used_bytes - modelled))
    current = plan_from_applied(profile, device.applied)
    return _Device(
        device=device,
        profile=profile,
        current=current,
        peak_now=current.peak(),
        high=int(policy.high_watermark * device.capacity_bytes),
        low=int(policy.low_watermark * device.capacity_bytes),
    )


def _actions(plan: Plan) -> tuple[Action, ...]:
    out = []
    for kind in KIND_ORDER:
        layers = plan.layers_of(kind)
        if layers:
            out.append(
                Action(
                    kind=kind,
                    layers=tuple(plan.p.names[i] for i in layers),
                    device_bytes_freed=plan.freed_bytes(kind),
                    host_bytes=plan.host_of(kind),
                    overhead_s=plan.overhead_of(kind),
                    prefetch=kind is ActionKind.SWAP_ACTIVATIONS,
                )
            )
    return tuple(out)


def _decision(d: _Device, verdict: Verdict, plan: Plan, reason: str, method: str = "",
              factor: float | None = None, suggested: int | None = None) -> OffloadDecision:
    kept = plan.applied_actions()
    undo = tuple(a for a in d.device.applied if a not in kept)
    return OffloadDecision(
        device_id=d.device.device_id,
        node_id=d.device.node_id,
        verdict=verdict,
        actions=_actions(plan),
        undo=undo,
        peak_now_bytes=d.peak_now,
        peak_after_bytes=plan.peak(),
        high_watermark_bytes=d.high,
        low_watermark_bytes=d.low,
        host_bytes=plan.host,
        overhead_s=plan.overhead(),
        reason=reason,
        micro_batch_factor=factor,
        suggested_micro_batch_size=suggested,
        method=method,
    )


def _cannot_meet(d: _Device, reason: str) -> OffloadDecision:
    """Nothing to apply: ``actions`` is empty and the applied actions stay as they are."""
    return OffloadDecision(
        device_id=d.device.device_id,
        node_id=d.device.node_id,
        verdict=Verdict.CANNOT_MEET,
        actions=(),
        undo=(),
        peak_now_bytes=d.peak_now,
        peak_after_bytes=d.peak_now,
        high_watermark_bytes=d.high,
        low_watermark_bytes=d.low,
        host_bytes=d.current.host,
        overhead_s=d.current.overhead(),
        reason=reason,
    )


def _lowest_peak(profile: Profile) -> int:
    both = recompute_everything(profile)
    for layer in range(profile.size):
        both.set_offload(layer, True)
    return min(swap_everything(profile).peak(), both.peak())


def _relax(d: _Device, result: SearchResult) -> OffloadDecision:
    plan = result.plan
    if plan.applied_actions():
        if plan.applied_actions() == d.current.applied_actions():
            return _decision(d, Verdict.KEEP, plan, "under the low watermark, but every applied "
                             "action is still needed to stay under the high watermark",
                             result.method)
        return _decision(d, Verdict.RELAX, plan, "under the low watermark: fewer or cheaper "
                         "actions still stay under the high watermark", result.method)
    static = plan.resident_static()
    activations = max(plan.sweep())
    undo_reason = "under the low watermark: no action is needed"
    if plan.peak() >= d.low or activations == 0:
        if d.device.applied:
            return _decision(d, Verdict.RELAX, plan, undo_reason, result.method)
        return _decision(d, Verdict.KEEP, plan, "nothing to change")
    factor = (d.high - static) / activations
    size = d.device.micro_batch_size
    suggested = None if size is None else (d.high - static) * size // activations
    if suggested is not None and suggested <= size:
        verdict = Verdict.RELAX if d.device.applied else Verdict.KEEP
        return _decision(d, verdict, plan, f"{undo_reason}; headroom is too small for a larger "
                         f"micro-batch than {size}", result.method, factor, None)
    grow = f"activations can grow {factor:.2f}x" + (
        "" if suggested is None else f": micro-batch {size} -> {suggested}"
    )
    return _decision(d, Verdict.RELAX, plan, f"{undo_reason}; {grow}", result.method, factor,
                     suggested)


def _plan_node(node: NodeMemory, members: list[_Device]) -> dict[str, OffloadDecision]:
    out: dict[str, OffloadDecision] = {}
    budget = node.free_host_bytes + sum(d.current.host for d in members)
    planned: list[_Device] = []
    for d in members:
        if d.low <= d.peak_now <= d.high:
            out[d.device.device_id] = _decision(d, Verdict.KEEP, d.current,
                                                "between the watermarks")
            budget -= d.current.host
        else:
            planned.append(d)
    # Device-side feasibility first: with unlimited host memory, is there any plan at all?
    solvable: list[_Device] = []
    for d in planned:
        if search(d.profile, d.current, d.high, 1 << 62, 0.0) is None:
            budget -= d.current.host  # it keeps what it has applied
            out[d.device.device_id] = _cannot_meet(
                d, f"device memory: the lowest peak any plan reaches is "
                   f"{_lowest_peak(d.profile)} bytes, above the high watermark {d.high} bytes "
                   f"(parameters, gradients and unexplained memory alone: "
                   f"{d.profile.fixed_bytes} bytes)")
        else:
            solvable.append(d)

    def solve_all(price: float) -> dict[str, SearchResult | None]:
        return {d.device.device_id: search(d.profile, d.current, d.high, budget, price)
                for d in solvable}

    def fits(results: dict[str, SearchResult | None]) -> bool:
        return all(r is not None for r in results.values()) and sum(
            r.plan.host for r in results.values() if r is not None) <= budget

    results = solve_all(0.0)
    if not fits(results):
        high_results = solve_all(PRICE_HIGH)
        if fits(high_results):
            lo, hi, results = PRICE_LOW, PRICE_HIGH, high_results
            for _ in range(BISECTIONS):
                mid = (lo * hi) ** 0.5
                trial = solve_all(mid)
                if fits(trial):
                    hi, results = mid, trial
                else:
                    lo = mid
        else:
            results = _share_scarce_host(solvable, budget)
    for d in solvable:
        result = results[d.device.device_id]
        if result is None:
            out[d.device.device_id] = _cannot_meet(
                d, f"host memory: node {node.node_id!r} has {budget} bytes of host memory "
                   f"for offload ({node.free_host_bytes} free now), not enough for this device "
                   "after the devices that need less")
        elif d.peak_now > d.high:
            out[d.device.device_id] = _decision(d, Verdict.APPLY, result.plan,
                                                "over the high watermark", result.method)
        else:
            out[d.device.device_id] = _relax(d, result)
    return out


def _share_scarce_host(solvable: list[_Device], budget: int) -> dict[str, SearchResult | None]:
    """Host memory in order of need at the highest price; devices left without get None.

    A device left without keeps its applied actions, so what they hold stays reserved.
    """
    need = {d.device.device_id: search(d.profile, d.current, d.high, budget, PRICE_HIGH)
            for d in solvable}
    order = sorted(solvable, key=lambda d: (
        need[d.device.device_id].plan.host if need[d.device.device_id] else 1 << 62,
        d.device.device_id))
    results: dict[str, SearchResult | None] = {}
    left = budget - sum(d.current.host for d in solvable)
    for d in order:
        available = left + d.current.host
        result = search(d.profile, d.current, d.high, available, PRICE_HIGH)
        results[d.device.device_id] = result
        if result is not None:
            left = available - result.plan.host
    return results


def decide_offload(
    devices: Sequence[DeviceMemory], nodes: Sequence[NodeMemory], policy: WatermarkPolicy
) -> list[OffloadDecision]:
    """One OffloadDecision per device, in the order of ``devices``.

    Raises InputError (a ValueError) naming the argument for input it cannot decide on.
    """
    by_id = validate(devices, nodes, policy)
    prepared = [_prepare(dev, f"devices[{i}]", policy) for i, dev in enumerate(devices)]
    decisions: dict[str, OffloadDecision] = {}
    for node_id in sorted({d.device.node_id for d in prepared}):
        members = [d for d in prepared if d.device.node_id == node_id]
        decisions.update(_plan_node(by_id[node_id], members))
    return [decisions[d.device_id] for d in devices]
