"""Scoring of the repair search's candidate steps, one layer at a time: re-points and swaps
(see :mod:`.repair_kernel` for the state and the steps)."""

from __future__ import annotations

import numpy as np
from numba import njit

from moeplane.controlplane.balancing.repair_primitives import _cost, _excess, _push, _top


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
