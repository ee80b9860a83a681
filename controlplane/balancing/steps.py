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

from controlplane.balancing.placement import take_rows

__all__ = ["best_steps", "extra_swaps"]

_REPOINT_CHOICES = 2  # candidate experts for a re-pointed slot of the most loaded GPU
_MIN_COST = 0.5  # a step that costs no move is scored as if it cost half a move


_GAIN, _LOSE = 0, 2  # codes: gaining the expert is a move / losing it removes a move


def _pair_cost(code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3, g, e, which):
    """Weighted move count of a (GPU g, expert e) change: where ``code == which`` (``_GAIN``:
    e gained on g is a move; ``_LOSE``: e lost from g removes a move), the weight of g, i.e.
    ``gpu_weight [G]`` of g (None: 1) times ``1 + cross_weight`` when no GPU of g's node held
    e in the reference; else 0. ``lid3``: layer indices broadcastable against ``g`` and ``e``;
    ``code [L, G, E]``, ``node_has [L, nodes, E]`` (or None). Flat gathers: no multi-index
    checks."""
    _, gpus, num_experts = code.shape
    hit = code.ravel()[(lid3 * gpus + g) * num_experts + e] == which
    if node_has is None:
        out = hit.astype(np.float64)
    else:
        nodes = node_has.shape[1]
        held = node_has.ravel()[(lid3 * nodes + node_of_gpu[g]) * num_experts + e]
        out = 1.0 + cross_weight * ~held
        out *= hit
    # in place: numpy's out-of-place broadcasting of a small operand against a large one
    # is several times slower here
    if gpu_weight is not None:
        out *= gpu_weight[g]
    return out


def _swap_cost(code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3, a3, xa3, b3, xj3):
    """Weighted move cost of swapping expert ``xa`` on GPU ``a`` with ``xj`` on GPU ``b``."""
    args = (code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3)
    gain_bx = _pair_cost(*args, b3, xa3, _GAIN)  # b gains a's expert
    gain_ay = _pair_cost(*args, a3, xj3, _GAIN)  # a gains b's expert
    lose_ax = _pair_cost(*args, a3, xa3, _LOSE)
    lose_by = _pair_cost(*args, b3, xj3, _LOSE)
    return gain_bx + gain_ay - lose_ax - lose_by


def best_steps(
    active, ph, wa, ca, cx, per, lg, a, l1, second, light, cnt, code, node_has, node_of_gpu,
    cross_weight, gpu_weight, spg, level,
):
    """The best step for the most loaded GPU ``a [A]`` (load ``l1 [A]``) of each active layer.

    ``ph [A, N]`` placements, ``wa [A, E]`` loads, ``ca [A, E]`` replica counts, ``cx [A, N]``
    replicas of each slot's expert, ``per [A, N]`` load per slot, ``lg [A, G]`` GPU loads,
    ``second [A, 2]`` the second and third most loaded GPUs, ``light [A, M]`` partner GPUs
    (never ``a``), ``cnt / code [L, G, E]`` replicas per GPU (``code`` = 2 * replicas + held
    in the reference, or None when moves are free), ``level [A]`` target GPU load (None: free
    moves). Returns None when no layer has an improving step, else (layers, slot, expert,
    slot2, expert2) arrays over the layers that step (``slot2 = -1`` for a re-point).
    """
    n_act, num_slots = ph.shape
    rows = np.arange(n_act)
    lid = active[:, None]
    lid3 = active[:, None, None]
    slot_gpu = np.arange(num_slots) // spg
    t2 = second[:, 0]
    l2 = lg[rows, t2]
    l3 = lg[rows, second[:, 1]] if lg.shape[1] >= 3 else np.full(n_act, -np.inf)
    js = (light[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, J]
    bj = js // spg

    sa = a[:, None] * spg + np.arange(spg)  # [A, S] slots of the most loaded GPU
    xa = take_rows(ph, sa)
    pa = take_rows(per, sa)
    wy = take_rows(wa, xa)
    cy = take_rows(ca, xa)
    xj = take_rows(ph, js)
    pj = take_rows(per, js)
    cj = take_rows(cx, js)
    lb = take_rows(lg, bj)  # [A, J]
    l1_3 = l1[:, None, None]

    # swaps: slot i of a <-> slot j of a partner
    delta = pa[:, :, None] - pj[:, None, :]
    sw_new = np.maximum(l1_3 - delta, lb[:, None, :] + delta)
    sw_ok = delta > 0

    # re-point partner slot j (expert x with >= 2 replicas) to y = an expert on a
    multi = cx > 1
    per_minus = np.where(multi, take_rows(wa, ph) / np.maximum(cx - 1, 1), 0.0)
    dx_up = np.where(multi, per_minus - per, 0.0)  # [A, N] rise of each holder per replica
    dy_down = wy / cy - wy / (cy + 1)  # [A, S]
    per_plus = wy / (cy + 1)
    gpus, num_experts = cnt.shape[1], cnt.shape[2]
    cflat = cnt.ravel()
    lg_lid = lid * gpus

    def count(g, e):  # cnt[layer, g, e] through flat indices (no multi-index checks)
        return cflat[(lg_lid.reshape((-1,) + (1,) * (np.ndim(g) - 1)) + g) * num_experts + e]

    n_slot_x = count(slot_gpu[None, :], ph)  # [A, N] replicas of x on the slot's GPU
    holder = lg[:, slot_gpu] + n_slot_x * dx_up
    holder[slot_gpu[None, :] == a[:, None]] = -np.inf
    hx = np.full(wa.shape, -np.inf)  # max new load of x's holders other than a  [A, E]
    np.maximum.at(hx.ravel(), (rows[:, None] * wa.shape[1] + ph).ravel(), holder.ravel())
    n_a_y = count(a[:, None], xa)  # [A, S]
    # only partner slots whose expert has >= 2 replicas can be re-pointed: gather those
    # first ([A, R], R = the most any layer has; ``ra_slot_ok`` masks the padding)
    multi_j = cj > 1
    n_r = max(int(multi_j.sum(axis=1).max()), 1)
    pos = np.argsort(~multi_j, axis=1, kind="stable")[:, :n_r]
    jr = take_rows(js, pos)  # [A, R] slots
    br = jr // spg
    xr = take_rows(xj, pos)
    ra_slot_ok = take_rows(multi_j, pos)
    dx_up_r = take_rows(dx_up, jr)
    n_a_xr = count(a[:, None], xr)  # [A, R]
    n_b_xr = take_rows(n_slot_x, jr)
    n_b_y = count(br[:, None, :], xa[:, :, None])  # [A, S, R]
    ra_a = l1_3 - (n_a_y * dy_down)[:, :, None] + (n_a_xr * dx_up_r)[:, None, :]
    ra_b = (
        (take_rows(lb, pos) + n_b_xr * dx_up_r - take_rows(per_minus, jr))[:, None, :]
        - n_b_y * dy_down[:, :, None]
        + per_plus[:, :, None]
    )
    ra_new = np.maximum(np.maximum(ra_a, ra_b), take_rows(hx, xr)[:, None, :])
    ra_ok = ra_slot_ok[:, None, :] & (xr[:, None, :] != xa[:, :, None])

    # re-point slot i of a (expert with >= 2 replicas) to an expert that costs a the least
    n_a_all = cnt[active, a, :]  # [A, E]
    term = (n_a_all + 1) * wa / (ca + 1) - n_a_all * wa / ca
    n_y = min(_REPOINT_CHOICES, term.shape[1])
    ycand = np.argpartition(term, n_y - 1, axis=1)[:, :n_y]  # [A, K] cheapest, any order
    t_y = take_rows(term, ycand)
    rb_a = (
        l1[:, None]
        + n_a_y * take_rows(dx_up, sa)
        - take_rows(per_minus, sa)
    )[:, :, None] + t_y[:, None, :]
    rb_new = np.maximum(rb_a, take_rows(hx, xa)[:, :, None])
    rb_ok = (cy > 1)[:, :, None] & (ycand[:, None, :] != xa[:, :, None])

    useful_below = l1 * (1 - 1e-9)
    if level is None:
        # free moves: the gain is the drop of the layer's maximum GPU load
        m_excl = np.where(bj == t2[:, None], l3[:, None], l2[:, None])  # [A, J]
        floors = (m_excl[:, None, :], l2[:, None, None], l2[:, None, None])
        blocks = []
        for new_b, ok_b, floor in zip((sw_new, ra_new, rb_new), (sw_ok, ra_ok, rb_ok), floors,
                                      strict=True):
            gain = l1_3 - np.maximum(new_b, floor)
            useful = ok_b & (new_b < useful_below[:, None, None]) & (gain > 1e-9 * l1_3)
            blocks.append(np.where(useful, gain, -np.inf))
    else:
        # costed moves: the gain is how far the step brings this GPU toward the target level
        # (a small share of any further drop breaks ties toward more margin), per move
        level3 = level[:, None, None]
        # a re-point elsewhere also relieves the other holders of y above the level (a hot
        # expert's replicas sit on several heavy GPUs): their drop toward the level counts
        excess = np.maximum(lg - level[:, None], 0.0)
        excess[rows, a] = 0.0
        n_over = max(int((excess > 0).sum(axis=1).max()), 1)  # only these GPUs can count
        over = np.argpartition(-excess, n_over - 1, axis=1)[:, :n_over]  # [A, V]
        n_g_y = count(over[:, :, None], xa[:, None, :])  # [A, V, S]
        relief = np.minimum(
            take_rows(excess, over)[:, :, None], n_g_y * dy_down[:, None, :]
        ).sum(axis=1)
        args = (code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3)
        a3 = a[:, None, None]
        b3 = bj[:, None, :]
        gain_bx = _pair_cost(*args, b3, xa[:, :, None], _GAIN)  # b gains a's expert [A, S, J]
        gain_axj = _pair_cost(*args, a3, xj[:, None, :], _GAIN)  # a gains b's expert [A, 1, J]
        lose_ax = _pair_cost(*args, a3, xa[:, :, None], _LOSE)  # [A, S, 1]
        lose_bxj = _pair_cost(*args, b3, xj[:, None, :], _LOSE)  # [A, 1, J]
        gain_ay = _pair_cost(*args, a3, ycand[:, None, :], _GAIN)  # [A, 1, K]
        sw_cost = gain_bx - lose_bxj + gain_axj - lose_ax
        gain_bxr = _pair_cost(*args, br[:, None, :], xa[:, :, None], _GAIN)  # [A, S, R]
        lose_bxr = _pair_cost(*args, br[:, None, :], xr[:, None, :], _LOSE)  # [A, 1, R]
        ra_cost = gain_bxr - lose_bxr
        rb_cost = gain_ay - lose_ax  # [A, S, K]
        extra = (0.0, relief[:, :, None], 0.0)
        blocks = []
        for new_b, ok_b, cost_b, more in zip(
            (sw_new, ra_new, rb_new), (sw_ok, ra_ok, rb_ok), (sw_cost, ra_cost, rb_cost), extra,
            strict=True,
        ):
            gain = l1_3 - np.maximum(new_b, level3) + 0.01 * (l1_3 - new_b) + more
            useful = ok_b & (new_b < useful_below[:, None, None])
            blocks.append(np.where(useful, gain / np.maximum(cost_b, _MIN_COST), -np.inf))
    # the best candidate of each block, then the best block (ties: the earlier block)
    flat = [blk.reshape(n_act, -1) for blk in blocks]
    idx = np.stack([np.argmax(f, axis=1) for f in flat], axis=1)  # [A, 3]
    val = np.stack([f[rows, idx[:, k]] for k, f in enumerate(flat)], axis=1)
    kind = np.argmax(val, axis=1)  # 0 swap, 1 re-point elsewhere, 2 re-point on a
    ok = np.isfinite(val[rows, kind])
    if not ok.any():
        return None
    r = np.nonzero(ok)[0]
    kind = kind[r]
    within = idx[r, kind]
    n_j = js.shape[1]
    # np.where evaluates every branch: keep each decoding in range
    i_sj = np.minimum(within // n_j, spg - 1)  # swap: (i, j)
    j_sj = within % n_j
    i_ra = np.minimum(within // n_r, spg - 1)  # re-point elsewhere: (i, r)
    j_ra = within % n_r
    i_rb = np.minimum(within // n_y, spg - 1)
    k_rb = within % n_y
    s1 = np.where(kind == 0, sa[r, i_sj], np.where(kind == 1, jr[r, j_ra], sa[r, i_rb]))
    e1 = np.where(kind == 0, xj[r, j_sj], np.where(kind == 1, xa[r, i_ra], ycand[r, k_rb]))
    s2 = np.where(kind == 0, js[r, j_sj], -1)
    e2 = np.where(kind == 0, xa[r, i_sj], -1)
    return active[r], s1, e1, s2, e2


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
