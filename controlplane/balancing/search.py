"""Local search on a placement: repeatedly relieve the most loaded GPUs of each layer.

Each round takes, for every layer still above its target, the best step of its most loaded
GPU and - when moves are costed - the best swap of each of its next ``heavy - 1`` most loaded
GPUs, each with its own partner GPUs among the lightest (candidates: ``steps.py``). All layers
of a round are one batch of numpy operations. No step raises the GPU it relieves or its
partner above the relieved GPU's load before the step.

Moves are counted exactly against the ``reference`` after every round. The search records
every state it passes through at round boundaries, so a caller can pick, per layer, how far
along to go (see ``selection.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.balancing.costs import CostTables, use_tables
from moeplane.controlplane.balancing.placement import gpu_expert_counts, replica_counts, take_rows
from moeplane.controlplane.balancing.selection import select_mean_slope
from moeplane.controlplane.balancing.steps import best_steps, extra_swaps

__all__ = ["RECEIVE_SMOOTH", "Trajectory", "local_search"]

_PARTNER_SLOTS = 60  # slots on partner GPUs (the lightest) searched per round, about
_FREE_PARTNER_SLOTS = 30  # the same for a fresh plan (free moves): fewer suffice
RECEIVE_SMOOTH = 2.0  # moves added to each GPU's count when weighing receipts (both searches)
_SLOPE_FACTOR = 1.5  # a layer stops once its last round gained < this x slope x moves;
# the selection's slope only rises as the search goes on, so a margin above 1 stops
# a layer a round earlier; 1.5 left the moves of all six benchmark plans unchanged


@dataclass(frozen=True)
class Trajectory:
    """States visited by ``local_search``.

    ``start [L, N]``: the starting placement. ``steps [K, 5]`` int64, in the order taken:
    (layer, slot, expert, slot2, expert2); ``slot2 = -1`` for a re-point, else the second
    slot of a swap. ``points [P, 4]`` float64: (layer, steps taken in that layer so far,
    moves against the reference, layer balancedness) for every visited state.
    """

    start: np.ndarray
    steps: np.ndarray
    points: np.ndarray

    @classmethod
    def from_logs(cls, start, steps_log, points_log) -> Trajectory:
        """A trajectory from a search's logs: ``steps_log`` per round (layers, s1, e1, s2,
        e2), ``points_log`` per batch (layer, steps, moves, balancedness), all ``[K]``."""
        if steps_log:
            steps = np.stack([np.concatenate(c) for c in zip(*steps_log, strict=True)], axis=1)
        else:
            steps = np.zeros((0, 5), dtype=np.int64)
        points = np.stack([np.concatenate(c) for c in zip(*points_log, strict=True)], axis=1)
        return cls(start=start.copy(), steps=steps.astype(np.int64),
                   points=points.astype(np.float64, copy=False))

    def placement(self, steps_per_layer: np.ndarray) -> np.ndarray:
        """The placement after the first ``steps_per_layer [L]`` steps of each layer."""
        phy = self.start.copy()
        if len(self.steps) == 0:
            return phy
        layer = self.steps[:, 0]
        order = np.argsort(layer, kind="stable")
        rank = np.empty(len(layer), dtype=np.int64)
        sorted_layer = layer[order]
        first = np.searchsorted(sorted_layer, sorted_layer, side="left")
        rank[order] = np.arange(len(layer)) - first
        keep = self.steps[rank < steps_per_layer[layer]]
        # writes in the order taken (slot, then slot2 of each step); the last write wins
        lay = np.repeat(keep[:, 0], 2)
        slot = keep[:, [1, 3]].ravel()
        expert = keep[:, [2, 4]].ravel()
        used = slot >= 0
        lay, slot, expert = lay[used][::-1], slot[used][::-1], expert[used][::-1]
        _, last = np.unique(lay * phy.shape[1] + slot, return_index=True)
        phy[lay[last], slot[last]] = expert[last]
        return phy


def receive_weight(received: np.ndarray) -> np.ndarray:
    """Cost weight of a move onto each GPU, ``received [G]`` moves it already takes: a rank
    receiving more than the mean costs more (a re-plan stalls for the rank that receives
    the most weights), one receiving less costs less; 1 when all receive alike."""
    # sum / count: np.mean's result, without its Python-level overhead
    return (received + RECEIVE_SMOOTH) / (received.sum() / len(received) + RECEIVE_SMOOTH)


def _heavy_count(gpus: int, costed: bool) -> int:
    """GPUs relieved per layer and round: 1 with free moves, else G / 8 (at least 1, at most 4)."""
    if not costed:
        return 1
    return max(1, min(4, gpus // 8))


def local_search(
    loads: np.ndarray,
    start: np.ndarray,
    gpus: int,
    *,
    reference: np.ndarray | None = None,
    node_of_gpu: np.ndarray | None = None,
    cross_weight: float = 0.0,
    target: np.ndarray | None = None,
    goal: float | None = None,
    max_steps: int,
) -> Trajectory:
    """Improve ``start [L, G*S]`` for ``loads [L, E]`` (float64, non-negative).

    ``reference [L, G*S]``: placement that moves are counted against (None: moves are free
    and each step takes the largest gain). ``node_of_gpu [G]``: node of each GPU (None: one
    node). ``target [L]``: a layer stops once its balancedness is at or below it.
    ``goal``: the mean balancedness ``select_mean`` will be asked for. Once the latest states
    reach it on average, that selection over the states visited so far gives the flattest
    balance per move it needs; a layer stops when the selection leaves its latest state
    unused or, later, when its last round bought less balance per move than that (later
    steps of a layer buy less, and more states only make the selection steeper).
    ``max_steps``: most rounds. Returns the visited states.
    """
    w = np.asarray(loads, dtype=np.float64)
    num_layers, num_experts = w.shape
    num_slots = start.shape[1]
    spg = num_slots // gpus
    phy = start.copy()
    cnt = gpu_expert_counts(phy, gpus, num_experts).astype(np.int32)
    rc = replica_counts(phy, num_experts)
    slot_gpu = np.arange(num_slots) // spg
    costed = reference is not None
    heavy = _heavy_count(gpus, costed)
    part_slots = _PARTNER_SLOTS if costed else _FREE_PARTNER_SLOTS
    n_part = min(-(-part_slots // spg), gpus - heavy)  # partner GPUs: the lightest
    # code = 2 * replicas + (GPU held the expert in the reference): 0 = gaining the expert
    # is a move, 2 = losing the only replica removes a move, anything else changes nothing.
    node_has = code = ref_has = tables = None
    moves = np.zeros(num_layers)
    received = None  # [G] moves onto each GPU, all layers
    if costed:
        ref_has, moves, received, node_has, code, tables = move_state(
            cnt, start, reference, node_of_gpu, cross_weight
        )
    done_steps = np.zeros(num_layers, dtype=np.int64)
    steps_log: list[tuple[np.ndarray, ...]] = []  # per round: (layers, s1, e1, s2, e2)
    points_log: list[tuple[np.ndarray, ...]] = []  # per batch: (layer, steps, moves, bal)
    active = np.arange(num_layers)
    latest = np.zeros(num_layers)  # balancedness of each layer's latest state
    latest_moves = np.zeros(num_layers)  # and its moves
    slope = None  # the selection's flattest balance per move, once the goal is in reach
    cached = None  # (layers, wx, cx, per, lg) of the state the next round starts from

    for round_no in range(max_steps + 1):
        if active.size == 0:
            break
        if len(active) == num_layers:  # every layer: the arrays themselves (read only)
            ph, wa, ca = phy, w, rc
        else:
            ph, wa, ca = phy[active], w[active], rc[active]
        if cached is not None and np.array_equal(cached[0], active):
            wx, cx, per, lg = cached[1:]  # the previous round's prefix points computed them
        else:
            flat = ph + np.arange(len(active))[:, None] * num_experts  # [A, N] into [A, E]
            cx = ca.ravel()[flat]
            wx = wa.ravel()[flat]
            per = wx / cx
            lg = per.reshape(len(active), gpus, spg).sum(axis=2)
        cached = None
        by_load = np.argsort(lg, axis=1, kind="stable")  # ascending
        l1 = lg.max(axis=1)
        mean = lg.sum(axis=1) / gpus
        loaded = mean > 0
        bal = np.where(loaded, l1 / np.where(loaded, mean, 1.0), 1.0)
        points_log.append((active, done_steps[active], moves[active], bal))
        stop = ~loaded
        if gpus < 2:
            stop[:] = True
        if target is not None:
            stop |= bal <= target[active]
        if slope is not None:
            gained = latest[active] - bal
            spent = moves[active] - latest_moves[active]
            stop |= gained < _SLOPE_FACTOR * slope * spent
        latest[active] = bal
        latest_moves[active] = moves[active]
        if slope is None and goal is not None and latest.sum() <= goal * num_layers:
            unused, slope = _left_unused(points_log, active, done_steps, num_layers, goal)
            stop |= unused
            if slope == np.inf:  # the starting states already reach the goal
                stop[:] = True
        if round_no == max_steps or stop.all():
            break
        if stop.any():
            keep = ~stop
            active, ph, wa, ca, wx, cx, per, lg, by_load, l1, mean = (
                v[keep] for v in (active, ph, wa, ca, wx, cx, per, lg, by_load, l1, mean)
            )
        level = None if target is None or not costed else target[active] * mean
        gpu_weight = None if received is None else receive_weight(received)
        if tables is not None:
            tables.update(code, gpu_weight)
        partners = by_load[:, :n_part]
        second = by_load[:, -3:-1][:, ::-1] if gpus >= 3 else by_load[:, -2:-1].repeat(2, 1)
        found = best_steps(
            active, ph, wa, ca, wx, cx, per, lg, by_load[:, -1], l1, second, partners,
            cnt, code, node_has, node_of_gpu, cross_weight, gpu_weight, tables, spg, level,
        )
        if heavy > 1:
            taken = np.zeros((len(active), gpus), dtype=bool)  # the top GPU's partner
            if found is not None:
                step_rows = np.searchsorted(active, found[0])
                taken[step_rows, slot_gpu[found[1]]] = True
                two = found[3] >= 0
                taken[step_rows[two], slot_gpu[found[3][two]]] = True
            more = extra_swaps(
                active, ph, per, lg, by_load[:, -heavy:-1][:, ::-1], partners, taken,
                code, node_has, node_of_gpu, cross_weight, gpu_weight, spg, level,
            )
            if more is not None:
                # ``extra`` marks the steps after a layer's top step; without any top step
                # the round's points are the next round's starting ones
                if found is None:
                    found, extra = more, np.zeros(len(more[0]), dtype=bool)
                else:
                    found = tuple(np.concatenate(p) for p in zip(found, more, strict=True))
                    extra = np.arange(len(found[0])) >= len(found[0]) - len(more[0])
                order = np.argsort(found[0], kind="stable")  # per layer: top GPU's step first
                found = tuple(v[order] for v in found) + (extra[order],)
        if found is None:
            break
        # without extra swaps the steps are one per layer, in the order of ``active``
        single = len(found) == 5
        layers, s1, e1, s2, e2 = found[:5]
        steps_log.append((layers, s1, e1, s2, e2))
        # the steps of one layer in a round touch disjoint GPUs and each step replaces an
        # expert with another, so each (layer, GPU, expert) they change occurs once
        step_moves, gained = apply_steps(phy, cnt, code, rc, ref_has, layers, s1, e1, s2, e2,
                                         slot_gpu, gpus, num_experts)
        if costed:
            received += gained
        if single:
            moves[layers] += step_moves
            done_steps[layers] += 1
            active = layers
            continue
        if found[5].any():
            pts, cached = prefix_points(w, phy, rc, layers, s1, s2, found[5], step_moves,
                                         done_steps, moves, gpus)
            points_log.append(pts)
        moves += np.bincount(layers, weights=step_moves, minlength=num_layers)
        done_steps += np.bincount(layers, minlength=num_layers)
        active = np.unique(layers)

    return Trajectory.from_logs(start, steps_log, points_log)


def move_state(cnt, start, reference, node_of_gpu, cross_weight):
    """What a costed search keeps about moves, from ``cnt [L, G, E]`` (replicas per GPU of
    ``start [L, G*S]``) and ``reference [L, G*S]``: ``ref_has [L, G, E]`` bool, moves per
    layer ``[L]`` and per receiving GPU ``[G]`` (float64), ``node_has [L, nodes, E]`` (None:
    one node), ``code`` (see ``costs``) and the ``CostTables`` for small layouts (else None).
    """
    num_layers, gpus, num_experts = cnt.shape
    same = reference is start or np.array_equal(reference, start)
    ref_has = cnt > 0 if same else gpu_expert_counts(reference, gpus, num_experts) > 0
    new_pairs = (cnt > 0) & ~ref_has
    moves = new_pairs.sum(axis=(1, 2)).astype(np.float64)
    received = new_pairs.sum(axis=(0, 2)).astype(np.float64)
    node_has = None
    if node_of_gpu is not None and int(node_of_gpu.max()) > 0:
        node_has = node_holdings(ref_has, node_of_gpu)
    code = cnt.astype(np.int16) * 2 + ref_has
    tables = CostTables(node_has, node_of_gpu, cross_weight) if use_tables(code) else None
    return ref_has, moves, received, node_has, code, tables


def node_holdings(ref_has: np.ndarray, node_of_gpu: np.ndarray) -> np.ndarray:
    """Whether some GPU of each node holds each expert: ``ref_has [L, G, E]`` bool,
    ``node_of_gpu [G]`` (GPU g on node g // (G / nodes)) -> ``[L, nodes, E]`` bool."""
    num_layers, gpus, num_experts = ref_has.shape
    nodes = int(node_of_gpu.max()) + 1
    return ref_has.reshape(num_layers, nodes, gpus // nodes, num_experts).any(2)


def apply_steps(phy, cnt, code, rc, ref_has, layers, s1, e1, s2, e2, slot_gpu, gpus,
                num_experts):
    """Apply a round's steps in place: slot ``s1 [K]`` of layer ``layers [K]`` gets expert
    ``e1``, and ``s2`` gets ``e2`` where ``s2 >= 0`` (a swap). ``cnt [L, G, E]`` replicas
    per GPU, ``code`` (or None) and ``rc [L, E]`` are updated; each (layer, GPU, expert) a
    step changes must occur once in the round. Returns the moves each step adds against the
    reference ``[K]`` and the moves each GPU gains ``[G]`` (zeros when ``ref_has`` is None:
    moves are free)."""
    two = np.nonzero(s2 >= 0)[0]
    idx = np.arange(len(layers))
    t_step = np.concatenate([idx, idx, two, two])
    t_gpu = slot_gpu[np.concatenate([s1, s1, s2[two], s2[two]])]
    t_exp = np.concatenate([phy[layers, s1], e1, phy[layers[two], s2[two]], e2[two]])
    t_lay = layers[t_step]
    key = (t_lay * gpus + t_gpu) * num_experts + t_exp  # flat [L, G, E] index
    if ref_has is not None:
        was_move = (cnt.ravel()[key] > 0) & ~ref_has.ravel()[key]
    # each (layer, GPU, expert) loses (-1) its old expert and gains (+1) the new one, in one
    # batched update per array
    n1, n2 = len(idx), len(two)
    sign = np.repeat(np.array([-1, 1, -1, 1], np.int64), [n1, n1, n2, n2])  # one per key
    np.add.at(cnt.ravel(), key, sign.astype(cnt.dtype))
    if code is not None:
        np.add.at(code.ravel(), key, (2 * sign).astype(code.dtype))
    np.add.at(rc.ravel(), t_lay * num_experts + t_exp, sign)
    phy[layers, s1] = e1
    phy[layers[two], s2[two]] = e2[two]
    if ref_has is None:
        return np.zeros(len(layers)), np.zeros(gpus)
    is_move = (cnt.ravel()[key] > 0) & ~ref_has.ravel()[key]
    change = is_move.astype(float) - was_move
    step_moves = np.bincount(t_step, weights=change, minlength=len(layers))
    return step_moves, np.bincount(t_gpu, weights=change, minlength=gpus)


def _left_unused(points_log, active, done_steps, num_layers, goal):
    """``[A]`` bool: the active layers whose latest state ``select_mean`` over the points so
    far does not take; and the balance per move of the flattest segment it takes."""
    pts = [np.concatenate(col) for col in zip(*points_log, strict=True)]
    layer = pts[0].astype(np.int64)
    pick, slope = select_mean_slope(layer, pts[2].astype(np.float64), pts[3], num_layers, goal)
    return pts[1][pick[active]] < done_steps[active], slope


def prefix_points(w, phy, rc, layers, s1, s2, extra, step_moves, done_steps, moves, gpus):
    """Points (layer, steps, moves, balancedness) after each step of a round, exact.

    ``layers, s1, s2, extra, step_moves [K]``: the round's steps grouped by layer (top GPU's
    step first; ``extra``: a swap of a further heavy GPU); ``phy``, ``rc`` already updated.
    Loads after the last step are recomputed; earlier ones undo the later swaps (a swap keeps
    replica counts, so its effect is exactly the two slots' loads exchanged). Returns the
    points as four ``[K]`` columns and (layers ``[U]``, load and replicas of each slot's
    expert, load per slot ``[U, N]``, GPU loads ``[U, G]``) after the round, which the next
    round starts from.
    """
    uniq, first, inverse = np.unique(layers, return_index=True, return_inverse=True)
    ph = phy[uniq]
    cx = take_rows(rc[uniq], ph)
    wx = take_rows(w[uniq], ph)
    per = wx / cx
    lg_end = per.reshape(len(uniq), gpus, -1).sum(axis=2)  # [U, G]
    spg = phy.shape[1] // gpus
    k = len(layers)
    rows = np.nonzero(extra)[0]
    eff = per[inverse[rows], s1[rows]] - per[inverse[rows], s2[rows]]  # rise of the heavy GPU
    delta = np.zeros((k, gpus))
    delta[rows, s1[rows] // spg] += eff
    delta[rows, s2[rows] // spg] -= eff
    csum = np.cumsum(delta, axis=0)
    base = np.where(first > 0, csum[np.maximum(first - 1, 0)].T, 0.0).T  # [U, G]
    seg = csum - base[inverse]  # effect of the layer's steps up to each step
    last = np.append(first[1:], k) - 1
    lg = lg_end[inverse] - seg[last][inverse] + seg
    mean = lg.mean(axis=1)
    bal = np.where(mean > 0, lg.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)
    mcum = np.cumsum(step_moves)
    mseg = mcum - np.where(first > 0, mcum[np.maximum(first - 1, 0)], 0.0)[inverse]
    pos = np.arange(k) - first[inverse]
    points = (layers, done_steps[layers] + pos + 1, moves[layers] + mseg, bal)
    return points, (uniq, wx, cx, per, lg_end)
