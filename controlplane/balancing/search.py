"""Local search on a placement: repeatedly relieve the most loaded GPU of each layer.

One step per layer per round, all layers of a round in one batch of numpy operations. The
candidate steps for a layer whose most loaded GPU is ``a``:

- *swap*: exchange the expert in a slot of ``a`` with the expert in a slot of another GPU;
- *re-point elsewhere*: a slot on another GPU holding an expert with >= 2 replicas is given
  one more replica of an expert on ``a`` (``a`` sheds part of that expert's tokens);
- *re-point on a*: a slot of ``a`` holding an expert with >= 2 replicas is given one of the
  experts whose extra replica costs ``a`` the least.

Each candidate's new maximum GPU load is computed exactly for swaps and bounded from above
for re-points (the real gain is never smaller than the estimate, so no step makes a layer
worse). With a ``reference`` placement the step taken is the one with the most gain per move
(moves counted exactly against the reference; a move whose weights must come from another
node costs ``1 + cross_weight``); without one it is the step with the most gain.

The search records every state it passes through so a caller can pick, per layer, how far
along to go (see ``selection.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.balancing.placement import gpu_expert_counts, replica_counts

__all__ = ["Trajectory", "local_search"]

_REPOINT_CHOICES = 2  # candidate experts for a re-pointed slot of the most loaded GPU
_MIN_COST = 0.5  # a step that costs no move is scored as if it cost half a move
_LIGHT_GPUS = 8  # swaps look at the slots of this many lightest GPUs
_REPLICA_SLOTS = 48  # re-points look at this many replicated slots on the lightest GPUs


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
        keep = rank < steps_per_layer[layer]
        for row in self.steps[keep]:  # steps of different layers commute; order kept per layer
            phy[row[0], row[1]] = row[2]
            if row[3] >= 0:
                phy[row[0], row[3]] = row[4]
        return phy


def local_search(
    loads: np.ndarray,
    start: np.ndarray,
    gpus: int,
    *,
    reference: np.ndarray | None = None,
    node_of_gpu: np.ndarray | None = None,
    cross_weight: float = 0.0,
    target: np.ndarray | None = None,
    max_steps: int,
) -> Trajectory:
    """Improve ``start [L, G*S]`` for ``loads [L, E]`` (float64, non-negative).

    ``reference [L, G*S]``: placement that moves are counted against (None: moves are free
    and each step takes the largest gain). ``node_of_gpu [G]``: node of each GPU (None: one
    node). ``target [L]``: a layer stops once its balancedness is at or below it.
    ``max_steps``: most steps per layer. Returns the visited states.
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
    # code = 2 * replicas + (GPU held the expert in the reference): 0 = gaining the expert
    # is a move, 2 = losing the only replica removes a move, anything else changes nothing.
    if costed:
        ref_has = gpu_expert_counts(reference, gpus, num_experts) > 0
        moves = ((cnt > 0) & ~ref_has).sum(axis=(1, 2)).astype(np.float64)
        if node_of_gpu is not None and int(node_of_gpu.max()) > 0:
            nodes = int(node_of_gpu.max()) + 1
            node_has = ref_has.reshape(num_layers, nodes, gpus // nodes, num_experts).any(2)
        else:
            node_has = None
        code = cnt.astype(np.int16) * 2 + ref_has
    else:
        moves = np.zeros(num_layers)
        code = node_has = None
    done_steps = np.zeros(num_layers, dtype=np.int64)
    steps_log: list[np.ndarray] = []
    points_log: list[np.ndarray] = []
    active = np.arange(num_layers)

    for round_no in range(max_steps + 1):
        if active.size == 0:
            break
        ph = phy[active]
        wa = w[active]
        ca = rc[active]
        cx = np.take_along_axis(ca, ph, axis=1)
        wx = np.take_along_axis(wa, ph, axis=1)
        per = wx / cx
        lg = per.reshape(len(active), gpus, spg).sum(axis=2)
        by_load = np.argsort(lg, axis=1, kind="stable")  # ascending
        l1 = np.take_along_axis(lg, by_load[:, -1:], axis=1)[:, 0]
        mean = lg.mean(axis=1)
        bal = np.where(mean > 0, l1 / np.where(mean > 0, mean, 1.0), 1.0)
        points_log.append(
            np.stack([active, done_steps[active], moves[active], bal], axis=1).astype(float)
        )
        stop = (mean <= 0) | (gpus < 2)
        if target is not None:
            stop |= bal <= target[active]
        if round_no == max_steps:
            break
        keep = ~stop
        if not keep.any():
            break
        active, ph, wa, ca, cx, wx, per, lg, by_load, l1 = (
            v[keep] for v in (active, ph, wa, ca, cx, wx, per, lg, by_load, l1)
        )
        chosen = _best_steps(
            active, ph, wa, ca, cx, wx, per, lg, by_load, l1, cnt, code, node_has,
            node_of_gpu, cross_weight, spg, num_experts,
            None if target is None or not costed else target[active] * lg.mean(axis=1),
        )
        if chosen is None:
            break
        layers, s1, e1, s2, e2, cost = chosen
        if costed:
            moves[layers] += np.round(cost)  # exact when cross_weight == 0
        done_steps[layers] += 1
        steps_log.append(np.stack([layers, s1, e1, s2, e2], axis=1))
        for slot, new in ((s1, e1), (s2, e2)):
            sel = slot >= 0
            lay, sl, ne = layers[sel], slot[sel], new[sel]
            old = phy[lay, sl]
            phy[lay, sl] = ne
            g = slot_gpu[sl]
            np.add.at(cnt, (lay, g, old), -1)
            np.add.at(cnt, (lay, g, ne), 1)
            if code is not None:
                np.add.at(code, (lay, g, old), -2)
                np.add.at(code, (lay, g, ne), 2)
            np.add.at(rc, (lay, old), -1)
            np.add.at(rc, (lay, ne), 1)
        if costed and cross_weight and node_has is not None:
            moves[layers] = ((cnt[layers] > 0) & ~ref_has[layers]).sum(axis=(1, 2))
        active = layers

    steps = np.concatenate(steps_log) if steps_log else np.zeros((0, 5), dtype=np.int64)
    points = np.concatenate(points_log) if points_log else np.zeros((0, 4))
    return Trajectory(start=start.copy(), steps=steps.astype(np.int64), points=points)


def _best_steps(
    active, ph, wa, ca, cx, wx, per, lg, by_load, l1, cnt, code, node_has, node_of_gpu,
    cross_weight, spg, num_experts, level,
):
    """The best step of each active layer, or None when no layer has an improving step.

    ``level [A]``: target GPU load per layer when moves are costed (None: free moves).
    Returns (layers, slot, expert, slot2, expert2, cost) arrays over the layers that step.
    Arrays with A rows are per active layer; N = slots, S = slots per GPU, J = candidate
    slots on the lightest GPUs.
    """
    n_act, num_slots = ph.shape
    gpus = lg.shape[1]
    rows = np.arange(n_act)
    a = by_load[:, -1]
    t2 = by_load[:, -2]
    l2 = lg[rows, t2]
    l3 = lg[rows, by_load[:, -3]] if gpus >= 3 else np.full(n_act, -np.inf)
    lid = active[:, None]
    lid3 = active[:, None, None]
    slot_gpu = np.arange(num_slots) // spg
    light = by_load[:, : min(gpus - 1, _LIGHT_GPUS)]  # [A, K] lightest GPUs (never a)
    js = (light[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, J]
    bj = js // spg

    sa = a[:, None] * spg + np.arange(spg)  # [A, S] slots of the most loaded GPU
    xa = np.take_along_axis(ph, sa, axis=1)
    pa = np.take_along_axis(per, sa, axis=1)
    wy = np.take_along_axis(wa, xa, axis=1)
    cy = np.take_along_axis(ca, xa, axis=1)
    xj = np.take_along_axis(ph, js, axis=1)
    pj = np.take_along_axis(per, js, axis=1)
    lb = np.take_along_axis(lg, bj, axis=1)  # [A, J]
    l1_3 = l1[:, None, None]

    # swaps: slot i of a <-> slot j on a light GPU
    delta = pa[:, :, None] - pj[:, None, :]
    m_excl = np.where(bj == t2[:, None], l3[:, None], l2[:, None])
    sw_new = np.maximum(l1_3 - delta, lb[:, None, :] + delta)
    sw_ok = delta > 0

    # re-point slot j (expert x with >= 2 replicas) to y = an expert on a
    multi = cx > 1
    per_minus = np.where(multi, wx / np.maximum(cx - 1, 1), 0.0)  # [A, N]
    dx_up = np.where(multi, per_minus - per, 0.0)
    dy_down = wy / cy - wy / (cy + 1)  # [A, S]
    per_plus = wy / (cy + 1)
    n_slot_x = cnt[lid, slot_gpu[None, :], ph]  # [A, N] replicas of x on the slot's GPU
    holder = lg[:, slot_gpu] + n_slot_x * dx_up
    holder[slot_gpu[None, :] == a[:, None]] = -np.inf
    hx = np.full((n_act, num_experts), -np.inf)  # max new load of x's holders other than a
    np.maximum.at(hx, (np.broadcast_to(rows[:, None], ph.shape), ph), holder)
    n_a_y = cnt[lid, a[:, None], xa]  # [A, S] (= replicas on a of the expert in each slot)
    # candidate slots: replicated experts on the lightest GPUs other than a  [A, R]
    on_a = slot_gpu[None, :] == a[:, None]
    rkey = np.where(multi & ~on_a, lg[:, slot_gpu], np.inf)
    jr = np.argsort(rkey, axis=1, kind="stable")[:, : min(_REPLICA_SLOTS, num_slots)]
    br = jr // spg
    xr = np.take_along_axis(ph, jr, axis=1)
    lbr = np.take_along_axis(lg, br, axis=1)
    dx_up_r = np.take_along_axis(dx_up, jr, axis=1)
    n_a_xr = cnt[lid, a[:, None], xr]  # [A, R]
    n_b_xr = np.take_along_axis(n_slot_x, jr, axis=1)
    n_b_y = cnt[lid3, br[:, None, :], xa[:, :, None]]  # [A, S, R]
    ra_a = l1_3 - (n_a_y * dy_down)[:, :, None] + (n_a_xr * dx_up_r)[:, None, :]
    ra_b = (
        (lbr + n_b_xr * dx_up_r - np.take_along_axis(per_minus, jr, axis=1))[:, None, :]
        - n_b_y * dy_down[:, :, None]
        + per_plus[:, :, None]
    )
    ra_new = np.maximum(np.maximum(ra_a, ra_b), np.take_along_axis(hx, xr, axis=1)[:, None, :])
    ra_ok = np.isfinite(np.take_along_axis(rkey, jr, axis=1))[:, None, :] & (
        xr[:, None, :] != xa[:, :, None]
    )

    # re-point slot i of a (expert with >= 2 replicas) to an expert that costs a the least
    n_a_all = cnt[active, a, :]  # [A, E]
    term = (n_a_all + 1) * wa / (ca + 1) - n_a_all * wa / ca
    ycand = np.argsort(term, axis=1, kind="stable")[:, :_REPOINT_CHOICES]  # [A, K]
    t_y = np.take_along_axis(term, ycand, axis=1)
    rb_a = (
        l1[:, None]
        + n_a_y * np.take_along_axis(dx_up, sa, axis=1)
        - np.take_along_axis(per_minus, sa, axis=1)
    )[:, :, None] + t_y[:, None, :]
    rb_new = np.maximum(rb_a, np.take_along_axis(hx, xa, axis=1)[:, :, None])
    rb_ok = (cy > 1)[:, :, None] & (ycand[:, None, :] != xa[:, :, None])

    # new_local: new load of every GPU the step changes (an upper bound for re-points)
    new_local = np.concatenate(
        [sw_new.reshape(n_act, -1), ra_new.reshape(n_act, -1), rb_new.reshape(n_act, -1)],
        axis=1,
    )
    valid = np.concatenate(
        [
            sw_ok.reshape(n_act, -1),
            np.broadcast_to(ra_ok, ra_new.shape).reshape(n_act, -1),
            np.broadcast_to(rb_ok, rb_new.shape).reshape(n_act, -1),
        ],
        axis=1,
    )
    useful = valid & (new_local < l1[:, None] * (1 - 1e-9))
    if level is None:
        # free moves: the gain is the drop of the layer's maximum GPU load
        floor = np.concatenate(
            [
                np.broadcast_to(m_excl[:, None, :], sw_new.shape).reshape(n_act, -1),
                np.broadcast_to(l2[:, None], (n_act, ra_new[0].size + rb_new[0].size)),
            ],
            axis=1,
        )
        gain = l1[:, None] - np.maximum(new_local, floor)
        useful &= gain > 1e-9 * l1[:, None]
    else:
        # costed moves: the gain is how far the step brings this GPU toward the target level
        # (a small share of any further drop breaks ties toward more margin)
        capped = l1[:, None] - np.maximum(new_local, level[:, None])
        gain = capped + 0.01 * (l1[:, None] - new_local)
    if code is not None:
        def pair(g, e):
            c_ = code[lid3, g, e]
            weight = 1.0
            if node_has is not None:
                weight = 1.0 + cross_weight * ~node_has[lid3, node_of_gpu[g], e]
            return (c_ == 0) * weight, (c_ == 2) * weight

        a3 = a[:, None, None]
        b3 = bj[:, None, :]
        gain_bx, _ = pair(b3, xa[:, :, None])  # b gains a's expert
        gain_ay, _ = pair(a3, xj[:, None, :])  # a gains b's expert
        _, lose_ax = pair(a3, xa[:, :, None])
        _, lose_by = pair(b3, xj[:, None, :])
        sw_cost = gain_bx + gain_ay - lose_ax - lose_by
        br3 = br[:, None, :]
        gain_rx, _ = pair(br3, xa[:, :, None])  # the re-pointed slot's GPU gains a's expert
        _, lose_rx = pair(br3, xr[:, None, :])  # ... and loses the slot's expert
        ra_cost = gain_rx - lose_rx
        gain_ay2, _ = pair(a3, ycand[:, None, :])
        rb_cost = np.broadcast_to(gain_ay2 - lose_ax, rb_new.shape)
        cost = np.concatenate(
            [sw_cost.reshape(n_act, -1), ra_cost.reshape(n_act, -1),
             rb_cost.reshape(n_act, -1)],
            axis=1,
        )
        score = np.where(useful, gain / np.maximum(cost, _MIN_COST), -np.inf)
    else:
        cost = np.zeros_like(gain)
        score = np.where(useful, gain, -np.inf)
    best = np.argmax(score, axis=1)
    ok = np.isfinite(score[rows, best])
    if not ok.any():
        return None
    r = np.nonzero(ok)[0]
    best = best[r]
    n_j = js.shape[1]
    n_r = jr.shape[1]
    kind = (best >= spg * n_j).astype(np.int64) + (best >= spg * (n_j + n_r))
    within = best - np.where(kind == 0, 0, np.where(kind == 1, spg * n_j, spg * (n_j + n_r)))
    # np.where evaluates every branch: keep each decoding in range
    i_sw = np.minimum(within // n_j, spg - 1)
    j_sw = within % n_j
    i_ra = np.minimum(within // n_r, spg - 1)
    j_ra = within % n_r
    i_rb = np.minimum(within // _REPOINT_CHOICES, spg - 1)
    k_rb = within % _REPOINT_CHOICES
    s1 = np.where(kind == 0, sa[r, i_sw], np.where(kind == 1, jr[r, j_ra], sa[r, i_rb]))
    e1 = np.where(
        kind == 0, xj[r, j_sw], np.where(kind == 1, xa[r, i_ra], ycand[r, k_rb])
    )
    s2 = np.where(kind == 0, js[r, j_sw], -1)
    e2 = np.where(kind == 0, xa[r, i_sw], -1)
    return active[r], s1, e1, s2, e2, cost[r, best]
