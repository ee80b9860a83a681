"""The cost model: predicted peak device memory, host memory and step-time overhead of a plan.

A *plan* chooses, for every layer ``l`` (forward order, ``0..L-1``), one activation action
``choice[l]`` in {NONE, SWAP, RECOMPUTE} and whether its optimizer state is offloaded
(``offload[l]``). Sizes per layer: ``act[l]`` saved activations, ``inp[l]`` the checkpointed
input of a recomputed layer, ``opt[l]`` optimizer state; ``fwd[l]``/``bwd[l]`` compute seconds;
``bw`` host<->device bytes/s in each direction (full duplex).

Peak memory (bytes). Let ``r[j]`` be what layer ``j`` keeps on the device after its forward:
``act[j]`` (NONE), ``0`` (SWAP), ``inp[j]`` (RECOMPUTE). While layer ``k`` runs backward the
device holds the residents of the layers below it, layer ``k``'s activations in full (fetched
back or recomputed), the prefetch of layer ``k-1`` when that layer is swapped, and the
offloaded optimizer state of the layers above ``k``, fetched back as soon as their gradients
are ready::

    sweep[k] = sum(r[:k]) + act[k] + (act[k-1] if choice[k-1] == SWAP else 0)
               + sum(opt[j] for j > k if offload[j])
    peak     = other + sum(param) + sum(grad) + sum(opt[j] for j if not offload[j])
               + max_k sweep[k]

The forward pass never exceeds this (an offloading copy of layer ``l`` while ``l+1`` runs
forward is the same footprint as ``sweep[l+1]``), and with no action ``max_k sweep[k]`` is
``sum(act)``: the forward/backward boundary. Gradients are counted in full (conservative).
So swapping or recomputing the top layer never lowers the peak, and swapping layer ``L-2``
does not either: one layer is always rematerialized at a time.

Overhead (seconds added to a step):

- SWAP of ``l``: offload while layer ``l+1`` runs forward, prefetch while it runs backward;
  only transfer time beyond those windows counts:
  ``max(0, t - fwd[l+1]) + max(0, t - bwd[l+1])`` with ``t = act[l] / bw`` and no window
  above the top layer.
- RECOMPUTE of ``l``: ``fwd[l]`` (its forward runs again in backward).
- OFFLOAD_OPTIMIZER: fetch (host->device) during backward and write-back (device->host)
  during the next forward, on the link time the swaps leave idle, pooled over the step:
  ``max(0, T - idle_bwd) + max(0, T - idle_fwd)`` with ``T = sum(opt[off]) / bw``,
  ``idle_fwd = sum(fwd) - hidden swap offloads``, ``idle_bwd = sum(bwd) + recomputed
  forwards - hidden swap prefetches``.

Host memory (bytes): ``sum(act[swapped]) + sum(opt[offloaded])``, pinned.

Everything here is exact integer arithmetic on bytes and float arithmetic on seconds; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from moeplane.controlplane.memory.types import ActionKind, AppliedAction, DeviceMemory

NONE, SWAP, RECOMPUTE = 0, 1, 2
CHOICE_KIND = {SWAP: ActionKind.SWAP_ACTIVATIONS, RECOMPUTE: ActionKind.RECOMPUTE}


@dataclass(frozen=True)
class Profile:
    """One device's layers as parallel tuples (length L, forward order), plus constants.

    ``fixed_bytes``: other + parameters + gradients (never moved by any action).
    ``window_fwd[l]``/``window_bwd[l]``: compute that hides a swap of layer ``l`` (the layer
    above it), 0 for the top layer.
    """

    names: tuple[str, ...]
    act: tuple[int, ...]
    inp: tuple[int, ...]
    opt: tuple[int, ...]
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    bandwidth: float
    fixed_bytes: int
    window_fwd: tuple[float, ...]
    window_bwd: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.names)

    def swap_time(self, layer: int) -> float:
        return self.act[layer] / self.bandwidth


def build_profile(device: DeviceMemory, other_bytes: int) -> Profile:
    """Profile of ``device`` with ``other_bytes`` of memory the layers do not explain."""
    layers = device.layers
    fwd = tuple(float(x.forward_s) for x in layers)
    bwd = tuple(float(x.backward_s) for x in layers)
    return Profile(
        names=tuple(x.name for x in layers),
        act=tuple(x.activation_bytes for x in layers),
        inp=tuple(min(x.input_bytes, x.activation_bytes) for x in layers),
        opt=tuple(x.optimizer_bytes for x in layers),
        fwd=fwd,
        bwd=bwd,
        bandwidth=float(device.host_bandwidth_bytes_per_s),
        fixed_bytes=other_bytes + sum(x.parameter_bytes + x.gradient_bytes for x in layers),
        window_fwd=fwd[1:] + (0.0,),
        window_bwd=bwd[1:] + (0.0,),
    )


class Plan:
    """A mutable plan for one profile with O(1) overhead/host updates and O(L) peak.

    Used only inside one search; the engine turns the final plan into frozen Actions.
    """

    def __init__(self, profile: Profile):
        self.p = profile
        self.choice = [NONE] * profile.size
        self.offload = [False] * profile.size
        self.swap_excess = 0.0
        self.hidden_fwd = 0.0
        self.hidden_bwd = 0.0
        self.recompute_s = 0.0
        self.offloaded_opt = 0
        self.host = 0

    def copy(self) -> Plan:
        other = Plan.__new__(Plan)
        other.__dict__.update(self.__dict__)
        other.choice = list(self.choice)
        other.offload = list(self.offload)
        return other

    # ---------------------------------------------------------------- edits

    def set_choice(self, layer: int, choice: int) -> None:
        self._account_choice(layer, self.choice[layer], -1)
        self.choice[layer] = choice
        self._account_choice(layer, choice, +1)

    def set_offload(self, layer: int, offload: bool) -> None:
        if self.offload[layer] == offload:
            return
        sign = 1 if offload else -1
        self.offload[layer] = offload
        self.offloaded_opt += sign * self.p.opt[layer]
        self.host += sign * self.p.opt[layer]

    def _account_choice(self, layer: int, choice: int, sign: int) -> None:
        p = self.p
        if choice == SWAP:
            t = p.swap_time(layer)
            wf, wb = p.window_fwd[layer], p.window_bwd[layer]
            self.swap_excess += sign * (max(0.0, t - wf) + max(0.0, t - wb))
            self.hidden_fwd += sign * min(t, wf)
            self.hidden_bwd += sign * min(t, wb)
            self.host += sign * p.act[layer]
        elif choice == RECOMPUTE:
            self.recompute_s += sign * p.fwd[layer]

    # ---------------------------------------------------------------- evaluation

    def optimizer_overhead(self) -> float:
        if self.offloaded_opt == 0:
            return 0.0
        t = self.offloaded_opt / self.p.bandwidth
        idle_fwd = max(0.0, sum(self.p.fwd) - self.hidden_fwd)
        idle_bwd = max(0.0, sum(self.p.bwd) + self.recompute_s - self.hidden_bwd)
        return max(0.0, t - idle_bwd) + max(0.0, t - idle_fwd)

    def overhead(self) -> float:
        return max(0.0, self.swap_excess) + max(0.0, self.recompute_s) + self.optimizer_overhead()

    def sweep(self) -> list[int]:
        """``sweep[k]`` of the module docstring, length L."""
        p = self.p
        above = self.offloaded_opt
        running = 0
        out = []
        for k in range(p.size):
            if self.offload[k]:
                above -= p.opt[k]
            prefetch = p.act[k - 1] if k > 0 and self.choice[k - 1] == SWAP else 0
            out.append(running + p.act[k] + prefetch + above)
            c = self.choice[k]
            running += p.act[k] if c == NONE else (0 if c == SWAP else p.inp[k])
        return out

    def resident_static(self) -> int:
        return self.p.fixed_bytes + sum(self.p.opt) - self.offloaded_opt

    def peak(self) -> int:
        return self.resident_static() + max(self.sweep())

    def freed_bytes(self, kind: ActionKind) -> int:
        """Bytes the actions of ``kind`` keep off the device (sum over layers)."""
        p = self.p
        if kind is ActionKind.OFFLOAD_OPTIMIZER:
            return self.offloaded_opt
        if kind is ActionKind.SWAP_ACTIVATIONS:
            return sum(p.act[i] for i, c in enumerate(self.choice) if c == SWAP)
        return sum(p.act[i] - p.inp[i] for i, c in enumerate(self.choice) if c == RECOMPUTE)

    def host_of(self, kind: ActionKind) -> int:
        p = self.p
        if kind is ActionKind.OFFLOAD_OPTIMIZER:
            return self.offloaded_opt
        if kind is ActionKind.SWAP_ACTIVATIONS:
            return sum(p.act[i] for i, c in enumerate(self.choice) if c == SWAP)
        return 0

    def overhead_of(self, kind: ActionKind) -> float:
        if kind is ActionKind.OFFLOAD_OPTIMIZER:
            return self.optimizer_overhead()
        if kind is ActionKind.SWAP_ACTIVATIONS:
            return max(0.0, self.swap_excess)
        return max(0.0, self.recompute_s)

    def layers_of(self, kind: ActionKind) -> tuple[int, ...]:
        if kind is ActionKind.OFFLOAD_OPTIMIZER:
            return tuple(i for i, off in enumerate(self.offload) if off)
        want = SWAP if kind is ActionKind.SWAP_ACTIVATIONS else RECOMPUTE
        return tuple(i for i, c in enumerate(self.choice) if c == want)

    def applied_actions(self) -> frozenset[AppliedAction]:
        names = self.p.names
        out = {AppliedAction(ActionKind.OFFLOAD_OPTIMIZER, names[i]) for i in
               self.layers_of(ActionKind.OFFLOAD_OPTIMIZER)}
        for i, c in enumerate(self.choice):
            if c != NONE:
                out.add(AppliedAction(CHOICE_KIND[c], names[i]))
        return frozenset(out)

    def key(self) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        return tuple(self.choice), tuple(self.offload)


def plan_from_applied(profile: Profile, applied: tuple[AppliedAction, ...]) -> Plan:
    """The plan in effect now. ``applied`` must already be validated against the layers."""
    plan = Plan(profile)
    index = {name: i for i, name in enumerate(profile.names)}
    for action in applied:
        i = index[action.layer]
        if action.kind is ActionKind.OFFLOAD_OPTIMIZER:
            plan.set_offload(i, True)
        elif action.kind is ActionKind.SWAP_ACTIVATIONS:
            plan.set_choice(i, SWAP)
        else:
            plan.set_choice(i, RECOMPUTE)
    return plan
