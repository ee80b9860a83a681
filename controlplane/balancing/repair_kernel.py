"""Compiled core of the repair search (``repair.py``): numba loops over one layer at a time.

Layers take turns, one *evaluation* each per round: every candidate step of the layer is
scored exactly on the layer's current state, then the best step is taken, and with it the
next best ones (down to ``keep`` of the best score) that touch no GPU a step taken before
touches, so their exact scores still hold. A score is the drop of the layer's potential per
weighted move (see ``repair.py``).

State (L layers, E experts, G GPUs, S slots per GPU, N = G*S slots):

- ``phy [L, N]`` int64: logical expert of each slot (updated in place);
- ``cnt [L, G, E]`` int32: replicas of each expert on each GPU; ``rc [L, E]``: replicas;
- ``share [L, E]`` float64: tokens per replica, ``w / rc``; ``lg [L, G]``: tokens per GPU;
- ``ref_has [L, G, E]`` bool: the GPU held the expert in the reference (regaining it is free);
- ``node_has [L, nodes, E]`` bool: some GPU of the node held it (a same-node copy).

Candidate steps of an evaluation (``_score_repoints``, ``_score_swaps``):

- *re-points*: a slot whose expert x has >= 2 replicas (the ``n_src`` slots whose loss of x
  costs the layer the least potential) gets one more replica of expert y (the ``n_y``
  experts whose extra replica takes the most potential off their holders);
- *swaps*: a slot of one of the ``heavy`` most loaded GPUs (above the level) exchanges its
  expert with a slot of the ``n_part`` least loaded GPUs.

Helpers in the innermost loops take scalars only: a numba call with array arguments costs
tens of nanoseconds of reference counting, more than the arithmetic it would save.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["repair_layers"]


@njit(cache=True, inline="always")
def _excess(load, lev, cw):
    """Potential of one GPU: its load above the level ``lev``, plus ``cw`` when above."""
    if load > lev:
        return load - lev + cw
    return 0.0


@njit(cache=True)
def _cost(count, held, node_held, weight, cross_w, lose):
    """Weighted moves of a GPU gaining (``lose`` False) or losing an expert, from the GPU's
    ``count`` of it, whether it ``held`` it in the reference and whether its node did: gaining
    one it neither holds nor held costs ``weight`` (times ``1 + cross_w`` when its node held
    none); losing its only replica of one it did not hold gives that back; else 0."""
    if held or (count != 1 if lose else count > 0):
        return 0.0
    return weight if node_held else (1.0 + cross_w) * weight


@njit(cache=True)
def _top(vals, n, k, out):
    """Indices of the ``k`` largest entries of ``vals[:n]`` (-inf entries skipped) into
    ``out``, largest first, ties to the lower index. Returns how many."""
    m = 0
    if k <= 0:
        return 0
    for i in range(n):
        v = vals[i]
        if v == -np.inf or (m == k and v <= vals[out[m - 1]]):
            continue
        pos = m if m < k else k - 1
        while pos > 0 and vals[out[pos - 1]] < v:
            out[pos] = out[pos - 1]
            pos -= 1
        out[pos] = i
        if m < k:
            m += 1
    return m


@njit(cache=True)
def _push(cs, cb, nb, sc, s1, e1, s2, e2):
    """Insert step (``s1, e1, s2, e2``, score ``sc``) into the buffer ``cs [T]`` / ``cb [T,
    4]``, sorted best first, ``nb`` entries so far; returns the new count (at most T)."""
    cap = cs.shape[0]
    if nb == cap and sc <= cs[cap - 1]:
        return nb
    pos = nb if nb < cap else cap - 1
    while pos > 0 and cs[pos - 1] < sc:
        cs[pos] = cs[pos - 1]
        cb[pos] = cb[pos - 1]
        pos -= 1
    cs[pos] = sc
    cb[pos, 0] = s1
    cb[pos, 1] = e1
    cb[pos, 2] = s2
    cb[pos, 3] = e2
    return nb + 1 if nb < cap else cap


@njit(cache=True)
def _grow(arr, need):
    """``arr [K, C]``, or a copy with at least ``need`` rows (doubling) when it has fewer."""
    if need <= arr.shape[0]:
        return arr
    out = np.empty((max(need, 2 * arr.shape[0]), arr.shape[1]), arr.dtype)
    out[: arr.shape[0]] = arr
    return out


@njit(cache=True)
def _point(points, i, layer, steps, moves, bal):
    points[i, 0] = layer
    points[i, 1] = steps
    points[i, 2] = moves
    points[i, 3] = bal


@njit(cache=True)
def _gpu_loads(phy, share, lay, gpus, spg, lg):
    for g in range(gpus):
        t = 0.0
        for k in range(g * spg, (g + 1) * spg):
            t += share[lay, phy[lay, k]]
        lg[lay, g] = t


@njit(cache=True)
def _holders(phy, cnt, lay, gpus, spg, num_experts, h_start, h_g, h_c, last):
    """Holders of each expert of layer ``lay``, as CSR: GPUs ``h_g[h_start[e]:h_start[e+1]]``
    (ascending) holding ``h_c`` replicas each. ``last [E]`` is scratch."""
    h_start[:] = 0
    last[:] = -1
    for s in range(gpus * spg):
        e = phy[lay, s]
        if last[e] != s // spg:
            last[e] = s // spg
            h_start[e + 1] += 1
    for e in range(num_experts):
        h_start[e + 1] += h_start[e]
    last[:] = -1
    for s in range(gpus * spg):  # h_start[e] advances to the end of e's run here...
        e, g = phy[lay, s], s // spg
        if last[e] != g:
            last[e] = g
            h_g[h_start[e]] = g
            h_c[h_start[e]] = cnt[lay, g, e]
            h_start[e] += 1
    for e in range(num_experts, 0, -1):  # ...and back to its start
        h_start[e] = h_start[e - 1]
    h_start[0] = 0


@njit(cache=True)
def _score_repoints(lay, state, costs, lev, cw, eps, hold, pay, n_src, n_y, min_cost, keep,
                    cs, cb, nb, scratch):
    """Score the layer's re-points into the buffer (``_push``); returns its new count."""
    w, phy, cnt, rc, share, lg = state
    ref_has, node_has, node_of_gpu, cross_w, gw = costs
    h_start, h_g, h_c, ex = hold
    gain_y, pre, src, ycand, y_plus, y_drop, y_most, dx, in_x = scratch
    lgl = lg[lay]
    num_experts = w.shape[1]
    num_slots = phy.shape[1]
    spg = num_slots // lgl.shape[0]
    buffer = cs.shape[0]
    # candidate experts y: the potential one more replica takes off their holders
    for e in range(num_experts):
        drop = share[lay, e] - w[lay, e] / (rc[lay, e] + 1)
        b = 0.0
        for q in range(h_start[e], h_start[e + 1]):
            g = h_g[q]
            if ex[g] > 0:
                b += ex[g] - _excess(lgl[g] - h_c[q] * drop, lev, cw)
        gain_y[e] = b if b > 0 else -np.inf
    ny = _top(gain_y, num_experts, n_y, ycand)
    for k in range(ny):
        y = ycand[k]
        y_plus[k] = w[lay, y] / (rc[lay, y] + 1)
        y_drop[k] = y_plus[k] - share[lay, y]  # < 0: each replica's change
        # the most potential y's holders can shed: a GPU whose load drops by d sheds at most
        # d + cw (the slot's GPU, which gains y, sheds none)
        b = 0.0
        for q in range(h_start[y], h_start[y + 1]):
            b += cw - h_c[q] * y_drop[k]
        y_most[k] = b
    # sources: potential change when the slot's expert x loses this replica (x's other
    # holders rise; the slot's GPU keeps its other replicas of x, which rise too)
    for s in range(num_slots):
        x = phy[lay, s]
        r = rc[lay, x]
        if r < 2:
            pre[s] = -np.inf
            continue
        g0 = s // spg
        up = w[lay, x] / (r - 1)
        u = 0.0
        for q in range(h_start[x], h_start[x + 1]):
            g = h_g[q]
            c = h_c[q] - 1 if g == g0 else h_c[q]
            u += ex[g] - _excess(lgl[g] + c * up - h_c[q] * share[lay, x], lev, cw)
        pre[s] = u
    ns = _top(pre, num_slots, n_src, src)
    for k in range(ns):
        s = src[k]
        x = phy[lay, s]
        g0 = s // spg
        n0 = node_of_gpu[g0]
        up = w[lay, x] / (rc[lay, x] - 1)
        for q in range(h_start[x], h_start[x + 1]):  # x's part, kept per GPU for y's
            g = h_g[q]
            c = h_c[q] - 1 if g == g0 else h_c[q]
            dx[g] = c * up - h_c[q] * share[lay, x]
            in_x[g] = True
        for j in range(ny):
            y = ycand[j]
            if y == x:
                continue
            cost = max(_cost(cnt[lay, g0, y], ref_has[lay, g0, y], node_has[lay, n0, y], gw[g0],
                             cross_w, False) - pay[s], min_cost)
            # a step scoring under ``keep`` of the best so far is never taken
            if nb > 0 and pre[s] + y_most[j] < keep * cs[0] * cost:
                continue
            gain = pre[s]
            seen0 = False
            for q in range(h_start[y], h_start[y + 1]):
                g = h_g[q]
                d = h_c[q] * y_drop[j]
                if g == g0:
                    d += y_plus[j]
                    seen0 = True
                if in_x[g]:
                    gain += _excess(lgl[g] + dx[g], lev, cw) - _excess(lgl[g] + dx[g] + d, lev, cw)
                else:
                    gain += ex[g] - _excess(lgl[g] + d, lev, cw)
            if not seen0:
                new0 = lgl[g0] + dx[g0]
                gain += _excess(new0, lev, cw) - _excess(new0 + y_plus[j], lev, cw)
            if gain <= eps:
                continue
            sc = gain / cost
            if (nb == 0 or sc >= keep * cs[0]) and (nb < buffer or sc > cs[buffer - 1]):
                nb = _push(cs, cb, nb, sc, s, y, -1, -1)
        for q in range(h_start[x], h_start[x + 1]):
            dx[h_g[q]] = 0.0
            in_x[h_g[q]] = False
    return nb


@njit(cache=True)
def _score_swaps(lay, state, costs, lev, cw, eps, ex, pay, hv, nh, light, nl, min_cost, keep,
                 cs, cb, nb, scratch):
    """Score swaps of the heavy GPUs ``hv[:nh]`` (most loaded first) with slots of the
    lightest GPUs ``light[:nl]`` into the buffer; returns its new count."""
    w, phy, cnt, rc, share, lg = state
    ref_has, node_has, node_of_gpu, cross_w, gw = costs
    j_slot, j_gpu, j_exp, j_share, j_load, j_ex, cost_a, cost_b = scratch
    lgl = lg[lay]
    spg = phy.shape[1] // lgl.shape[0]
    buffer = cs.shape[0]
    nj = 0  # the partner slots, gathered once
    for m in range(nl):
        b = light[m]
        is_heavy = False
        for h in range(nh):
            is_heavy |= hv[h] == b
        if is_heavy:  # (load ties) a GPU is never its own partner
            continue
        for j in range(b * spg, (b + 1) * spg):
            j_slot[nj] = j
            j_gpu[nj] = m
            j_exp[nj] = phy[lay, j]
            j_share[nj] = share[lay, j_exp[nj]]
            j_load[nj] = lgl[b]
            j_ex[nj] = ex[b]
            nj += 1
    for h in range(nh):
        a = hv[h]
        if ex[a] <= 0:
            break
        la = lgl[a]
        na = node_of_gpu[a]
        for k in range(nj):
            e = j_exp[k]
            cost_a[k] = _cost(cnt[lay, a, e], ref_has[lay, a, e], node_has[lay, na, e], gw[a],
                              cross_w, False) - pay[j_slot[k]]
        for i in range(a * spg, (a + 1) * spg):
            xa = phy[lay, i]
            pa = share[lay, xa]
            for m in range(nl):
                b = light[m]
                cost_b[m] = _cost(cnt[lay, b, xa], ref_has[lay, b, xa],
                                  node_has[lay, node_of_gpu[b], xa], gw[b], cross_w,
                                  False) - pay[i]
            for k in range(nj):
                delta = pa - j_share[k]
                if delta <= 0 or j_exp[k] == xa:
                    continue
                gain = ex[a] + j_ex[k] - _excess(la - delta, lev, cw) - _excess(
                    j_load[k] + delta, lev, cw)
                if gain <= eps:
                    continue
                sc = gain / max(cost_b[j_gpu[k]] + cost_a[k], min_cost)
                if (nb == 0 or sc >= keep * cs[0]) and (nb < buffer or sc > cs[buffer - 1]):
                    nb = _push(cs, cb, nb, sc, i, j_exp[k], j_slot[k], xa)
    return nb


@njit(cache=True)
def _disjoint(lay, phy, spg, hold, cs, cb, nb, keep, touched, tl):
    """Move to the front of ``cb`` the steps an evaluation takes: the best, then each next
    (down to ``keep`` of the best score) touching no GPU a taken step touches: the slot's GPU
    and the holders of both experts of a re-point, both GPUs of a swap. Returns how many."""
    h_start, h_g, _, _ = hold
    touched[:] = False
    n_take = 0
    for c in range(nb):
        if c > 0 and cs[c] < keep * cs[0]:
            break
        s1, e1, s2 = cb[c, 0], cb[c, 1], cb[c, 2]
        nt = 0
        if s2 < 0:
            x = phy[lay, s1]
            for e in (x, e1):
                for q in range(h_start[e], h_start[e + 1]):
                    tl[nt] = h_g[q]
                    nt += 1
            tl[nt] = s1 // spg
            nt += 1
        else:
            tl[0] = s1 // spg
            tl[1] = s2 // spg
            nt = 2
        clash = False
        for k in range(nt):
            clash |= touched[tl[k]]
        if clash:
            continue
        for k in range(nt):
            touched[tl[k]] = True
        cb[n_take] = cb[c]
        n_take += 1
    return n_take


@njit(cache=True)
def _apply(lay, state, ref_has, spg, s, e_new, moves, received):
    """Slot ``s`` of layer ``lay`` gets expert ``e_new``: counts, shares, moves per layer and
    per receiving GPU updated (GPU loads are not)."""
    w, phy, cnt, rc, share, _ = state
    g = s // spg
    for e, d in ((phy[lay, s], -1), (e_new, 1)):
        was = cnt[lay, g, e] > 0 and not ref_has[lay, g, e]
        cnt[lay, g, e] += d
        rc[lay, e] += d
        share[lay, e] = w[lay, e] / rc[lay, e] if rc[lay, e] > 0 else 0.0
        now = cnt[lay, g, e] > 0 and not ref_has[lay, g, e]
        change = (1.0 if now else 0.0) - (1.0 if was else 0.0)
        moves[lay] += change
        received[g] += change
    phy[lay, s] = e_new


@njit(cache=True)
def repair_layers(w, phy, ref_has, node_has, node_of_gpu, cross_w, levels, gpus, max_rounds,
                  count_weight, n_src, n_y, n_part, heavy, min_cost, keep, buffer,
                  receive_smooth):
    """Repair ``phy [L, N]`` (int64, in place) toward ``levels [L]`` (balancedness) for loads
    ``w [L, E]`` (float64); at most ``max_rounds`` evaluations per layer.

    A move onto GPU g weighs ``(received_g + receive_smooth) / (mean received +
    receive_smooth)`` (``received``: moves each GPU takes so far). Returns (steps ``[K, 5]``
    int64: layer, slot, expert, slot2, expert2 (-1, -1 for a re-point), in the order taken;
    points ``[P, 4]`` float64: layer, steps so far, moves against the reference,
    balancedness; the start of each layer and every state after a step)."""
    num_layers, num_experts = w.shape
    num_slots = phy.shape[1]
    spg = num_slots // gpus
    cnt = np.zeros((num_layers, gpus, num_experts), np.int32)
    rc = np.zeros((num_layers, num_experts), np.int64)
    received = np.zeros(gpus)
    moves = np.zeros(num_layers)
    for lay in range(num_layers):
        for s in range(num_slots):
            e, g = phy[lay, s], s // spg
            cnt[lay, g, e] += 1
            rc[lay, e] += 1
            if cnt[lay, g, e] == 1 and not ref_has[lay, g, e]:
                moves[lay] += 1
                received[g] += 1
    share = np.zeros((num_layers, num_experts))
    for lay in range(num_layers):
        for e in range(num_experts):
            if rc[lay, e] > 0:
                share[lay, e] = w[lay, e] / rc[lay, e]
    lg = np.zeros((num_layers, gpus))
    state = (w, phy, cnt, rc, share, lg)
    gw = np.empty(gpus)  # the round's move weight per GPU
    costs = (ref_has, node_has, node_of_gpu, cross_w, gw)
    steps = np.empty((8 * num_layers, 5), np.int64)
    points = np.empty((8 * num_layers, 4))
    n_steps = 0
    n_pts = 0
    done = np.zeros(num_layers, np.int64)
    active = np.zeros(num_layers, np.bool_)
    counted = np.ones(num_layers, np.bool_)  # the potential counts the GPUs above the level
    for lay in range(num_layers):
        _gpu_loads(phy, share, lay, gpus, spg, lg)
        mean = lg[lay].sum() / gpus
        bal = lg[lay].max() / mean if mean > 0 else 1.0
        _point(points, n_pts, lay, 0, moves[lay], bal)
        n_pts += 1
        active[lay] = gpus > 1 and mean > 0 and bal > levels[lay]

    # scratch, reused by every evaluation
    ex = np.empty(gpus)
    hold = (np.zeros(num_experts + 1, np.int64), np.zeros(num_slots, np.int64),
            np.zeros(num_slots, np.int64), ex)
    last = np.zeros(num_experts, np.int64)
    pay = np.empty(num_slots)  # weighted moves given back when the slot's expert leaves
    n_src, n_y = max(min(n_src, num_slots), 1), max(min(n_y, num_experts), 1)
    rp_scratch = (np.empty(num_experts), np.empty(num_slots), np.zeros(n_src, np.int64),
                  np.zeros(n_y, np.int64), np.zeros(n_y), np.zeros(n_y), np.zeros(n_y),
                  np.zeros(gpus), np.zeros(gpus, np.bool_))
    heavy = max(min(heavy, gpus), 1)
    n_light = max(min(n_part, gpus - heavy), 0)
    sw_scratch = (np.zeros(num_slots, np.int64), np.zeros(num_slots, np.int64),
                  np.zeros(num_slots, np.int64), np.zeros(num_slots), np.zeros(num_slots),
                  np.zeros(num_slots), np.zeros(num_slots), np.zeros(max(n_light, 1)))
    key = np.empty(gpus)
    hv = np.zeros(heavy, np.int64)
    light = np.zeros(max(n_light, 1), np.int64)
    cs = np.zeros(buffer)
    cb = np.zeros((buffer, 4), np.int64)
    touched = np.zeros(gpus, np.bool_)
    tl = np.zeros(2 * gpus + 1, np.int64)

    for _round in range(max_rounds):
        if not active.any():
            break
        for lay in range(num_layers):
            if not active[lay]:
                continue
            lgl = lg[lay]
            mean = lgl.sum() / gpus
            lev = levels[lay] * mean
            norm = received.sum() / gpus + receive_smooth
            for g in range(gpus):
                gw[g] = (received[g] + receive_smooth) / norm
            _holders(phy, cnt, lay, gpus, spg, num_experts, hold[0], hold[1], hold[2], last)
            for s in range(num_slots):
                g, e = s // spg, phy[lay, s]
                pay[s] = _cost(cnt[lay, g, e], ref_has[lay, g, e], node_has[lay, node_of_gpu[g], e],
                               gw[g], cross_w, True)
            key[:] = lgl
            nh = _top(key, gpus, heavy, hv)
            key[:] = -lgl
            nl = _top(key, gpus, n_light, light)
            eps = 1e-9 * mean
            nb = 0
            for _attempt in range(2):
                cw = count_weight * lev if counted[lay] else 0.0
                for g in range(gpus):
                    ex[g] = _excess(lgl[g], lev, cw)
                nb = _score_repoints(lay, state, costs, lev, cw, eps, hold, pay, n_src, n_y,
                                     min_cost, keep, cs, cb, 0, rp_scratch)
                nb = _score_swaps(lay, state, costs, lev, cw, eps, ex, pay, hv, nh, light, nl,
                                  min_cost, keep, cs, cb, nb, sw_scratch)
                if nb > 0 or not counted[lay]:
                    break
                counted[lay] = False  # no step lowers the potential: on with the excess alone
            if nb == 0:
                active[lay] = False  # no step lowers the excess either
                continue
            n_take = _disjoint(lay, phy, spg, hold, cs, cb, nb, keep, touched, tl)
            steps = _grow(steps, n_steps + n_take)
            points = _grow(points, n_pts + n_take)
            for c in range(n_take):
                _apply(lay, state, ref_has, spg, cb[c, 0], cb[c, 1], moves, received)
                if cb[c, 2] >= 0:
                    _apply(lay, state, ref_has, spg, cb[c, 2], cb[c, 3], moves, received)
                steps[n_steps, 0] = lay
                steps[n_steps, 1:] = cb[c]
                n_steps += 1
                done[lay] += 1
                _gpu_loads(phy, share, lay, gpus, spg, lg)
                bal = lgl.max() / mean
                _point(points, n_pts, lay, done[lay], moves[lay], bal)
                n_pts += 1
                if bal <= levels[lay]:
                    active[lay] = False
                    break
    return steps[:n_steps].copy(), points[:n_pts].copy()
