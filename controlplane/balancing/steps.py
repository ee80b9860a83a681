"""Candidate steps of the local search (``search.py``), scored for every layer in one batch.

For a layer whose most loaded GPU is ``a`` (``best_steps``):

- *swap*: exchange the expert in a slot of ``a`` with the expert in a slot of a partner GPU;
- *re-point elsewhere*: a partner-GPU slot holding an expert with >= 2 replicas is given one
  more replica of an expert on ``a`` (``a`` sheds part of that expert's tokens);
- *re-point on a*: a slot of ``a`` holding an expert with >= 2 replicas is given one of the
  experts whose extra replica costs ``a`` the least.

When moves are costed, the next most loaded GPUs of the layer each take their best swap in
the same round (``extra_swaps``), each with a partner GPU no other step of the round uses, so
the steps of a round touch disjoint GPUs.

Each candidate's new load is computed exactly for swaps and bounded from above for re-points.
With costs, a step's score is its gain toward the target level per move (a move whose weights
must come from another node costs ``1 + cross_weight``); a re-point elsewhere also counts the
drop toward the level of the other GPUs holding the expert it replicates. Without costs, the
score is the step's drop of the layer's maximum.

Shapes: A active layers, N = G*S slots, S slots per GPU, M partner GPUs, J = M*S partner slots.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.balancing.costs import GAIN, LOSE, pair_cost
from moeplane.controlplane.balancing.placement import take_rows

__all__ = ["best_steps", "extra_swaps"]

_REPOINT_CHOICES = 2  # candidate experts for a re-pointed slot of the most loaded GPU
_MIN_COST = 0.5  # a step that costs no move is scored as if it cost half a move


def _swap_cost(code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3, a3, xa3, b3, xj3):
    """Weighted move cost of swapping expert ``xa`` on GPU ``a`` with ``xj`` on GPU ``b``."""
    args = (code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3)
    gain_bx = pair_cost(*args, b3, xa3, GAIN)  # b gains a's expert
    gain_ay = pair_cost(*args, a3, xj3, GAIN)  # a gains b's expert
    lose_ax = pair_cost(*args, a3, xa3, LOSE)
    lose_by = pair_cost(*args, b3, xj3, LOSE)
    return gain_bx + gain_ay - lose_ax - lose_by


def best_steps(
    active, ph, wa, ca, wx, cx, per, lg, a, l1, second, light, cnt, code, node_has,
    node_of_gpu, cross_weight, gpu_weight, tables, spg, level,
):
    """The best step for the most loaded GPU ``a [A]`` (load ``l1 [A]``) of each active layer.

    ``ph [A, N]`` placements, ``wa [A, E]`` loads, ``ca [A, E]`` replica counts, ``wx / cx
    [A, N]`` load and replicas of each slot's expert, ``per [A, N]`` load per slot, ``lg [A,
    G]`` GPU loads, ``second [A, 2]`` the second and third most loaded GPUs, ``light [A, M]``
    partner GPUs (never ``a``), ``cnt / code [L, G, E]`` replicas per GPU (``code`` = 2 *
    replicas + held in the reference, or None when moves are free), ``tables``: the round's
    ``costs.CostTables`` (None: costs by ``pair_cost``), ``level [A]`` target GPU load (None:
    free moves). Returns None when no layer has an improving step, else (layers, slot,
    expert, slot2, expert2) arrays over the layers that step (``slot2 = -1`` for a re-point).
    """
    n_act, num_slots = ph.shape
    gpus, num_experts = cnt.shape[1], cnt.shape[2]
    rows = np.arange(n_act)
    rw = rows[:, None]
    # gathers by flat index into the raveled [A, *] arrays: the row offsets added once (a
    # two-array index costs ~3x a flat one on these sizes)
    r_slot, r_exp = rw * num_slots, rw * num_experts
    phf, perf, lgf = ph.ravel(), per.ravel(), lg.ravel()
    slot_gpu = np.arange(num_slots) // spg
    n_j = light.shape[1] * spg
    js = (light[:, :, None] * spg + np.arange(spg)).reshape(n_act, n_j)  # [A, J]
    jsf = js + r_slot
    bj = js // spg
    sa = a[:, None] * spg + np.arange(spg)  # [A, S] slots of the most loaded GPU
    saf = sa + r_slot
    xa = phf[saf]
    pa = perf[saf]
    xa_e = xa + r_exp
    wy = wa.ravel()[xa_e]
    cy = ca.ravel()[xa_e]
    xj = phf[jsf]
    pj = perf[jsf]
    cj = cx.ravel()[jsf]
    lb = lgf[bj + rw * gpus]  # [A, J]
    l1_3 = l1[:, None, None]
    multi = cx > 1
    per_minus = np.where(multi, wx / np.maximum(cx - 1, 1), 0.0)
    dx_up = np.where(multi, per_minus - per, 0.0)  # [A, N] rise of each holder per replica
    per_plus = wy / (cy + 1)
    dy_down = wy / cy - per_plus  # [A, S]
    pmf, dxf = per_minus.ravel(), dx_up.ravel()
    # flat [L, G, E] indices: ``gbase`` = (layer, GPU) part of each slot's GPU, then + expert
    cflat = cnt.ravel()
    gbase = (active[:, None] * gpus + slot_gpu) * num_experts  # [A, N]
    a_base = ((active * gpus + a) * num_experts)[:, None]  # [A, 1]
    n_slot_x = cflat[gbase + ph]  # [A, N] replicas of x on the slot's GPU
    holder = lg[:, slot_gpu] + n_slot_x * dx_up
    holder.ravel()[saf] = -np.inf
    hx = np.full(wa.shape, -np.inf)  # max new load of x's holders other than a  [A, E]
    hxf = hx.ravel()
    np.maximum.at(hxf, (r_exp + ph).ravel(), holder.ravel())
    key_ay = a_base + xa  # [A, S]
    n_a_y = cflat[key_ay]
    # only partner slots whose expert has >= 2 replicas can be re-pointed: gather those
    # first ([A, R], R = the most any layer has; ``ra_slot_ok`` masks the padding)
    multi_j = cj > 1
    n_r = max(int(multi_j.sum(axis=1).max()), 1)
    posf = np.argsort(~multi_j, axis=1, kind="stable")[:, :n_r] + rw * n_j
    jr = js.ravel()[posf]  # [A, R] slots
    jrf = jr + r_slot
    xr = xj.ravel()[posf]
    ra_slot_ok = multi_j.ravel()[posf]
    dx_up_r = dxf[jrf]
    br_base = gbase.ravel()[jrf]  # [A, R]
    n_a_xr = cflat[a_base + xr]  # [A, R]
    n_b_xr = n_slot_x.ravel()[jrf]
    key_by = br_base[:, None, :] + xa[:, :, None]  # [A, S, R]
    n_b_y = cflat[key_by]

    # every candidate in one row per layer: swaps [S, J], re-points elsewhere [S, R], then
    # re-points on a [S, K]; ``new``: the new load bounding the step, ``ok``: allowed
    n_y = min(_REPOINT_CHOICES, num_experts)
    off_ra = spg * n_j
    off_rb = off_ra + spg * n_r
    width = off_rb + spg * n_y
    new = np.empty((n_act, width))
    ok = np.empty((n_act, width - off_ra), dtype=bool)  # re-points only (swaps: see below)
    cost = np.empty((n_act, width)) if level is not None else None

    def block(arr, lo, hi, n):
        return arr[:, lo:hi].reshape(n_act, spg, n)

    # swaps: slot i of a <-> slot j of a partner
    delta = pa[:, :, None] - pj[:, None, :]
    down = l1_3 - delta
    delta += lb[:, None, :]  # b's new load, in place (addition commutes exactly)
    np.maximum(down, delta, out=block(new, 0, off_ra, n_j))

    # re-point partner slot j (expert x with >= 2 replicas) to y = an expert on a
    ra_a = l1_3 - (n_a_y * dy_down)[:, :, None] + (n_a_xr * dx_up_r)[:, None, :]
    # (b's load + x's rise - x's replica) - y's drop on b + y's new replica, in place
    ra_b = n_b_y * dy_down[:, :, None]
    np.subtract((lb.ravel()[posf] + n_b_xr * dx_up_r - pmf[jrf])[:, None, :], ra_b, out=ra_b)
    ra_b += per_plus[:, :, None]
    np.maximum(ra_a, ra_b, out=ra_a)
    np.maximum(ra_a, hxf[xr + r_exp][:, None, :], out=block(new, off_ra, off_rb, n_r))
    ra_ok = xr[:, None, :] != xa[:, :, None]
    np.bitwise_and(ra_ok, ra_slot_ok[:, None, :], out=block(ok, 0, off_rb - off_ra, n_r))

    # re-point slot i of a (expert with >= 2 replicas) to an expert that costs a the least
    n_a_all = cflat[a_base + np.arange(num_experts)]  # [A, E]
    term = (n_a_all + 1) * wa / (ca + 1) - n_a_all * wa / ca
    ycand = np.argpartition(term, n_y - 1, axis=1)[:, :n_y]  # [A, K] cheapest, any order
    t_y = term.ravel()[ycand + r_exp]
    rb_a = (l1[:, None] + n_a_y * dxf[saf] - pmf[saf])[:, :, None] + t_y[:, None, :]
    np.maximum(rb_a, hxf[xa_e][:, :, None], out=block(new, off_rb, width, n_y))
    rb_ok = ycand[:, None, :] != xa[:, :, None]
    np.bitwise_and(rb_ok, (cy > 1)[:, :, None], out=block(ok, off_rb - off_ra, None, n_y))

    # a swap needs delta > 0, which new < l1 * (1 - 1e-9) implies (l1 > 0 in an active
    # layer; with delta <= 0, new >= l1 - delta >= l1 exactly)
    useful = new < (l1 * (1 - 1e-9))[:, None]
    useful[:, off_ra:] &= ok
    if level is None:
        # free moves: the gain is the drop of the layer's maximum GPU load; the floor is the
        # highest load of the GPUs a step leaves alone
        t2 = second[:, 0]
        l2 = lg[rows, t2]
        l3 = lg[rows, second[:, 1]] if gpus >= 3 else np.full(n_act, -np.inf)
        floor = np.empty((n_act, width))
        floor[:, :off_ra].reshape(n_act, spg, n_j)[:] = np.where(
            bj == t2[:, None], l3[:, None], l2[:, None]
        )[:, None, :]
        floor[:, off_ra:] = l2[:, None]
        np.maximum(new, floor, out=floor)
        gain = np.subtract(l1[:, None], floor, out=floor)
        useful &= gain > (1e-9 * l1)[:, None]
        score = np.multiply(gain, useful, out=gain)
    else:
        # costed moves: the gain is how far the step brings this GPU toward the target level
        # (a small share of any further drop breaks ties toward more margin), per move
        # a re-point elsewhere also relieves the other holders of y above the level (a hot
        # expert's replicas sit on several heavy GPUs): their drop toward the level counts
        excess = np.maximum(lg - level[:, None], 0.0)
        excess[rows, a] = 0.0
        n_over = max(int((excess > 0).sum(axis=1).max()), 1)  # only these GPUs can count
        over = np.argpartition(-excess, n_over - 1, axis=1)[:, :n_over]  # [A, V]
        over_base = (active[:, None] * gpus + over) * num_experts
        n_g_y = cflat[over_base[:, :, None] + xa[:, None, :]]  # [A, V, S]
        ex_over = excess.ravel()[over + rw * gpus][:, :, None]  # [A, V, 1]
        relief = np.minimum(ex_over, n_g_y * dy_down[:, None, :]).sum(axis=1)
        _step_costs(
            cost, off_ra, off_rb, n_j, n_r, n_y, tables, code, node_has, node_of_gpu,
            cross_weight, gpu_weight, active, a, a_base, light, bj, gbase.ravel()[jsf], xa, xj,
            ycand, jr // spg, br_base, xr, key_ay, key_by,
        )
        # l1 - max(new, level) + 0.01 * (l1 - new), the first term as min(l1 - new, l1 -
        # level): rounding is monotonic, so both forms give the same float
        drop = np.subtract(l1[:, None], new, out=new)  # ``new`` is not needed any more
        gain = np.minimum(drop, (l1 - level)[:, None])
        drop *= 0.01
        gain += drop
        block(gain, off_ra, off_rb, n_r)[:] += relief[:, :, None]
        np.maximum(cost, _MIN_COST, out=cost)
        score = np.multiply(np.divide(gain, cost, out=gain), useful, out=gain)
    # the best candidate of each layer (ties: the earliest, so swaps before re-points). A
    # useful step scores > 0 (it lowers the GPU by more than 1e-9 of its load: the gain,
    # including the 0.01 share of the drop, is positive); the rest score 0
    best = np.argmax(score, axis=1)
    ok_row = score.ravel()[best + rows * width] > 0
    if not ok_row.any():
        return None
    r = np.nonzero(ok_row)[0]
    within = best[r]
    # (i, j): a's slot and the candidate's other index within its block; np.where below
    # evaluates every branch, so each decoding is kept in range (``%``: never negative)
    kind = (within >= off_ra).astype(np.int64) + (within >= off_rb)
    i, j = np.divmod(within - np.array([0, off_ra, off_rb])[kind], np.array([n_j, n_r, n_y])[kind])
    is_swap = kind == 0
    s1 = np.where(kind == 1, jr.ravel()[r * n_r + j % n_r], a[r] * spg + i)
    jj = r * n_j + j % n_j
    xa_i = xa.ravel()[r * spg + i]
    y_j = ycand.ravel()[r * n_y + j % n_y]
    e1 = np.where(is_swap, xj.ravel()[jj], np.where(kind == 1, xa_i, y_j))
    s2 = np.where(is_swap, js.ravel()[jj], -1)
    e2 = np.where(is_swap, xa_i, -1)
    return active[r], s1, e1, s2, e2


def _step_costs(
    cost, off_ra, off_rb, n_j, n_r, n_y, tables, code, node_has, node_of_gpu, cross_weight,
    gpu_weight, active, a, a_base, light, bj, bj_base, xa, xj, ycand, br, br_base, xr, key_ay,
    key_by,
):
    """Weighted move costs of ``best_steps``'s candidates, written into ``cost [A, width]``
    (swaps, re-points elsewhere, re-points on a). ``light [A, M]``: partner GPUs, ``bj [A,
    J]`` the GPU of each partner slot; ``*_base``: flat ``[L, G, E]`` index of (layer, GPU)
    for ``a [A]``, ``bj``, ``br [A, R]``; ``key_ay [A, S]`` / ``key_by [A, S, R]``: those of
    (a, a's experts) / (br, a's experts)."""
    n_act, spg = xa.shape
    sw = cost[:, :off_ra].reshape(n_act, spg, n_j)
    ra = cost[:, off_ra:off_rb].reshape(n_act, spg, n_r)
    rb = cost[:, off_rb:].reshape(n_act, spg, n_y)
    if tables is not None:
        gain, lose = tables.gain, tables.lose
        light_base = (active[:, None] * code.shape[1] + light) * code.shape[2]
        gain_bx = gain[light_base[:, None, :] + xa[:, :, None]]  # b gains a's expert [A, S, M]
        gain_axj = gain[a_base + xj][:, None, :]  # a gains b's expert [A, 1, J]
        lose_ax = lose[key_ay][:, :, None]  # [A, S, 1]
        lose_bxj = lose[bj_base + xj][:, None, :]  # [A, 1, J]
        gain_ay = gain[a_base + ycand][:, None, :]  # [A, 1, K]
        gain_bxr = gain[key_by]  # [A, S, R]
        lose_bxr = lose[br_base + xr][:, None, :]  # [A, 1, R]
    else:
        args = (code, node_has, node_of_gpu, cross_weight, gpu_weight, active[:, None, None])
        a3 = a[:, None, None]
        b3 = bj[:, None, :]
        br3 = br[:, None, :]
        gain_bx = pair_cost(*args, light[:, None, :], xa[:, :, None], GAIN)  # [A, S, M]
        gain_axj = pair_cost(*args, a3, xj[:, None, :], GAIN)
        lose_ax = pair_cost(*args, a3, xa[:, :, None], LOSE)
        lose_bxj = pair_cost(*args, b3, xj[:, None, :], LOSE)
        gain_ay = pair_cost(*args, a3, ycand[:, None, :], GAIN)
        gain_bxr = pair_cost(*args, br3, xa[:, :, None], GAIN)
        lose_bxr = pair_cost(*args, br3, xr[:, None, :], LOSE)
    # "b gains a's expert" is the same for every slot of partner GPU b: repeated over its
    # slots ([A, S, M] -> [A, S, J], a copy), then in place on that fresh array (a 4-D
    # broadcast has an inner loop of only S), and one write into the strided block
    # (in-place operations on a strided view are about twice as slow)
    sw_cost = np.repeat(gain_bx, spg, axis=2)
    sw_cost -= lose_bxj
    sw_cost += gain_axj
    np.subtract(sw_cost, lose_ax, out=sw)
    np.subtract(gain_bxr, lose_bxr, out=ra)
    np.subtract(gain_ay, lose_ax, out=rb)


def extra_swaps(
    active, ph, per, lg, heavy, partners, taken, code, node_has, node_of_gpu, cross_weight,
    gpu_weight, spg, level,
):
    """The best swap of each further heavy GPU (costed moves only), heaviest first, each with
    a partner GPU that no earlier step of the round in that layer uses.

    ``heavy [A, H]`` GPUs (the 2nd, 3rd, ... most loaded), ``partners [A, M]`` candidate
    partner GPUs (never in ``heavy``), ``taken [A, G]`` bool: GPUs already used this round
    (updated in place); other arguments as in ``best_steps``. Returns None or (layers, slot,
    expert, slot2, expert2) over the (layer, heavy GPU) pairs with a swap gaining toward
    ``level``, ordered by layer then heaviness.
    """
    n_act, n_heavy = heavy.shape
    rows = np.arange(n_act)
    lh = take_rows(lg, heavy)  # [A, H]
    sa = (heavy[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, H*S]
    js = (partners[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, J]
    bj = js // spg
    n_j = js.shape[1]
    xa = take_rows(ph, sa).reshape(n_act, n_heavy, spg)
    pa = take_rows(per, sa).reshape(n_act, n_heavy, spg)
    xj = take_rows(ph, js)
    pj = take_rows(per, js)
    lb = take_rows(lg, bj)  # [A, J]
    lh4 = lh[:, :, None, None]
    delta = pa[:, :, :, None] - pj[:, None, None, :]  # [A, H, S, J]
    new_local = np.maximum(lh4 - delta, lb[:, None, None, :] + delta)
    lev = level[:, None, None, None]
    gain = lh4 - np.maximum(new_local, lev) + 0.01 * (lh4 - new_local)
    useful = (delta > 0) & (new_local < lh4 * (1 - 1e-9)) & (lh4 > lev)
    cost = _swap_cost(
        code, node_has, node_of_gpu, cross_weight, gpu_weight, active[:, None, None, None],
        heavy[:, :, None, None], xa[:, :, :, None], bj[:, None, None, :],
        xj[:, None, None, :],
    )
    score = np.where(useful, gain / np.maximum(cost, _MIN_COST), -np.inf)
    out = []
    for h in range(n_heavy):
        sc = np.where(taken[rows[:, None], bj][:, None, :], -np.inf, score[:, h])
        sc = sc.reshape(n_act, -1)
        best = np.argmax(sc, axis=1)
        r = np.nonzero(np.isfinite(sc[rows, best]))[0]
        if r.size == 0:
            continue
        i, j = np.divmod(best[r], n_j)
        taken[r, bj[r, j]] = True
        out.append((active[r], sa[r, h * spg + i], xj[r, j], js[r, j], xa[r, h, i]))
    if not out:
        return None
    return tuple(np.concatenate(parts) for parts in zip(*out, strict=True))
