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

from moeplane.controlplane.balancing.repair_primitives import (
    _cost,
    _excess,
    _gpu_loads,
    _grow,
    _holders,
    _point,
    _top,
)
from moeplane.controlplane.balancing.repair_scoring import _score_repoints, _score_swaps

__all__ = ["repair_layers"]


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
