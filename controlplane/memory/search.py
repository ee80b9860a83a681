"""Find a cheap plan for one device: peak <= target bytes, host <= budget bytes.

What it optimises: the predicted step-time overhead plus ``price`` seconds per pinned host
byte (``price`` is how the engine shares a node's host memory among its devices; 0 when host
memory is plentiful), subject to the predicted peak being at most ``target`` and host use at
most ``host_budget``. Method, all deterministic:

1. Greedy from several starts (no action; the actions applied now; recompute-everything;
   swap-and-offload-everything): repeatedly add the action with the lowest added cost per
   byte of *peak* it removes (exact, from prefix/suffix maxima of the backward sweep; the
   bytes counted are capped at what is still needed), until the peak is under ``target``.
2. Improvement: drop actions that are no longer needed (most expensive first), then
   one-for-one exchanges (e.g. a swap for a recomputation, or one layer for another) while
   they lower the cost and keep the plan feasible.
3. The cheapest feasible result over all starts wins (ties: the earlier start).

It is a heuristic: not guaranteed optimal, but never worse than the feasible starts, so
never worse than the recompute-everything or swap-everything plans when those fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from moeplane.controlplane.memory.model import NONE, RECOMPUTE, SWAP, Plan, Profile

NEG = float("-inf")
EPS = 1e-12

# A move is (kind, layer): kind 0 = set choice SWAP, 1 = set choice RECOMPUTE, 2 = offload opt.
MOVE_SWAP, MOVE_RECOMPUTE, MOVE_OFFLOAD = 0, 1, 2


@dataclass(frozen=True)
class SearchResult:
    plan: Plan
    method: str


def objective(plan: Plan, price: float) -> float:
    return plan.overhead() + price * plan.host


def feasible(plan: Plan, target: int, host_budget: int) -> bool:
    return plan.host <= host_budget and plan.peak() <= target


def recompute_everything(profile: Profile) -> Plan:
    """Every layer recomputed (the checkpoint-every-layer baseline)."""
    plan = Plan(profile)
    for layer in range(profile.size):
        plan.set_choice(layer, RECOMPUTE)
    return plan


def swap_everything(profile: Profile) -> Plan:
    """Every layer's activations swapped and every optimizer state offloaded."""
    plan = Plan(profile)
    for layer in range(profile.size):
        plan.set_choice(layer, SWAP)
        plan.set_offload(layer, True)
    return plan


def _prefix_suffix_max(sweep: list[int]) -> tuple[list[float], list[float]]:
    """pre[i] = max(sweep[:i]) and suf[i] = max(sweep[i:]), both of length L+1."""
    n = len(sweep)
    pre: list[float] = [NEG] * (n + 1)
    suf: list[float] = [NEG] * (n + 1)
    for i in range(n):
        pre[i + 1] = max(pre[i], sweep[i])
    for i in range(n - 1, -1, -1):
        suf[i] = max(suf[i + 1], sweep[i])
    return pre, suf


def _peak_after_move(plan: Plan, move: int, layer: int, pre, suf) -> float:
    """Peak after one move on a layer whose activation choice is NONE (or opt on device)."""
    p = plan.p
    static = plan.resident_static()
    if move == MOVE_SWAP:
        # sweep[l+1] is unchanged (prefetch replaces the resident); above it drops by act[l].
        return static + max(pre[min(layer + 2, p.size)], suf[min(layer + 2, p.size)] - p.act[layer])
    if move == MOVE_RECOMPUTE:
        return static + max(pre[layer + 1], suf[layer + 1] - (p.act[layer] - p.inp[layer]))
    # Offload: leaves the static part, returns to the device for the sweeps below the layer.
    return static - p.opt[layer] + max(pre[layer] + p.opt[layer], suf[layer])


def _apply(plan: Plan, move: int, layer: int) -> None:
    if move == MOVE_OFFLOAD:
        plan.set_offload(layer, True)
    else:
        plan.set_choice(layer, SWAP if move == MOVE_SWAP else RECOMPUTE)


def _undo(plan: Plan, move: int, layer: int) -> None:
    if move == MOVE_OFFLOAD:
        plan.set_offload(layer, False)
    else:
        plan.set_choice(layer, NONE)


def _resident_freed(p: Profile, move: int, layer: int) -> int:
    if move == MOVE_SWAP:
        return p.act[layer]
    if move == MOVE_RECOMPUTE:
        return p.act[layer] - p.inp[layer]
    return p.opt[layer]


def _open_moves(plan: Plan):
    p = plan.p
    for layer in range(p.size):
        if plan.choice[layer] == NONE and p.act[layer] > 0:
            yield MOVE_SWAP, layer
            if p.act[layer] > p.inp[layer]:
                yield MOVE_RECOMPUTE, layer
        if not plan.offload[layer] and p.opt[layer] > 0:
            yield MOVE_OFFLOAD, layer


def greedy(plan: Plan, target: int, host_budget: int, price: float) -> bool:
    """Add moves to ``plan`` until its peak is <= target; False when it cannot."""
    p = plan.p
    while True:
        sweep = plan.sweep()
        peak = plan.resident_static() + max(sweep)
        if peak <= target:
            return True
        need = peak - target
        pre, suf = _prefix_suffix_max(sweep)
        base = objective(plan, price)
        best = None
        best_surrogate = None
        for move, layer in _open_moves(plan):
            _apply(plan, move, layer)
            over_budget = plan.host > host_budget
            cost = objective(plan, price) - base
            _undo(plan, move, layer)
            if over_budget:
                continue
            gain = peak - _peak_after_move(plan, move, layer, pre, suf)
            if gain > 0:
                key = (cost / min(gain, need), layer, move)
                if best is None or key < best:
                    best = key
            elif best is None:
                freed = _resident_freed(p, move, layer)
                key = (cost / freed, layer, move)
                if best_surrogate is None or key < best_surrogate:
                    best_surrogate = key
        chosen = best or best_surrogate
        if chosen is None:
            return False
        _apply(plan, chosen[2], chosen[1])


def _present_moves(plan: Plan) -> list[tuple[int, int]]:
    out = []
    for layer in range(plan.p.size):
        if plan.choice[layer] == SWAP:
            out.append((MOVE_SWAP, layer))
        elif plan.choice[layer] == RECOMPUTE:
            out.append((MOVE_RECOMPUTE, layer))
        if plan.offload[layer]:
            out.append((MOVE_OFFLOAD, layer))
    return out


def prune(plan: Plan, target: int, host_budget: int, price: float) -> None:
    """Drop moves (most cost-saving first) while the plan stays feasible and gets cheaper."""
    base = objective(plan, price)
    ranked = []
    for move, layer in _present_moves(plan):
        _undo(plan, move, layer)
        ranked.append((objective(plan, price) - base, layer, move))
        _apply(plan, move, layer)
    for _, layer, move in sorted(ranked):
        before = objective(plan, price)
        _undo(plan, move, layer)
        if objective(plan, price) <= before + EPS and feasible(plan, target, host_budget):
            continue
        _apply(plan, move, layer)


def exchange(plan: Plan, target: int, host_budget: int, price: float, rounds: int) -> None:
    """One-for-one replacements that lower the objective, at most ``rounds`` accepted.

    For each present move the plan without it is swept once (O(L)); the peak after adding
    each replacement then follows from prefix/suffix maxima in O(1).
    """
    for _ in range(rounds):
        improved = False
        base = objective(plan, price)
        for move_a, layer_a in _present_moves(plan):
            _undo(plan, move_a, layer_a)
            sweep = plan.sweep()
            pre, suf = _prefix_suffix_max(sweep)
            for move_b, layer_b in list(_open_moves(plan)):
                if (move_b, layer_b) == (move_a, layer_a):
                    continue
                if _peak_after_move(plan, move_b, layer_b, pre, suf) > target:
                    continue
                _apply(plan, move_b, layer_b)
                if plan.host <= host_budget and objective(plan, price) < base - EPS * max(
                    1.0, base
                ):
                    improved = True
                    break
                _undo(plan, move_b, layer_b)
            if improved:
                break
            _apply(plan, move_a, layer_a)
        if not improved:
            return
        prune(plan, target, host_budget, price)


def search(
    profile: Profile, current: Plan, target: int, host_budget: int, price: float
) -> SearchResult | None:
    """Cheapest feasible plan found (see module docstring), or None when none was found."""
    starts = [
        ("greedy", Plan(profile)),
        ("greedy from applied", current.copy()),
        ("pruned recompute-everything", recompute_everything(profile)),
        ("pruned swap-everything", swap_everything(profile)),
    ]
    best: tuple[float, int, SearchResult] | None = None
    seen = set()
    for order, (method, plan) in enumerate(starts):
        if plan.host > host_budget:
            continue
        if not greedy(plan, target, host_budget, price):
            continue
        prune(plan, target, host_budget, price)
        if plan.key() in seen:
            continue
        seen.add(plan.key())
        exchange(plan, target, host_budget, price, rounds=2 * profile.size + 4)
        score = objective(plan, price)
        if best is None or score < best[0] - EPS * max(1.0, score):
            best = (score, order, SearchResult(plan, method))
    return None if best is None else best[2]
