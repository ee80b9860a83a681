"""Repair search: bring every GPU of each layer under a load level with the fewest moves.

Where ``search.local_search`` relieves the most loaded GPU of a layer, this search scores
every candidate by how much it lowers the layer's *total excess* over its level,
``sum_g max(0, load_g - level)``, per move. A step that relieves several GPUs at once (one
more replica of an expert whose replicas sit on several GPUs above the level) then counts
for all of them, and a step that pushes another GPU over the level pays for it.

Each GPU above the level also counts ``_COUNT_WEIGHT`` of the level (the potential is
``sum_g max(0, load_g - level) + w * level * [load_g > level]``): what costs moves is the
number of GPUs still over the level, so a step that brings a GPU under it outranks one that
only trims the excess of several (sim 58x256 / 64x5: 12.8 % -> 11.6 % of copies moved for
the same balance). The scores add per-GPU changes, which can misjudge a step (one GPU
holding both experts of a re-point): a layer whose potential did not drop in a round goes
on with the excess alone, and stops once that does not drop either (it would cycle).

Candidates of a round, per active layer:

- *re-points*: a slot whose expert x has >= 2 replicas (the ``_SOURCES`` donors whose loss
  costs the least excess) gets one more replica of a candidate expert y (the ``_Y_CHOICES``
  experts whose extra replica takes the most excess off their holders); x's other holders
  rise, y's holders drop, the slot's GPU trades its share of x for one of y;
- *swaps* of each of the ``_HEAVY`` most loaded GPUs with a slot of the lightest GPUs.

A round takes, per layer, the best re-point of each candidate y (best first, up to
``_REPOINTS``, each touching no GPU an earlier step of the round touches: the slot's GPU
and the holders of x and y) when the best re-point beats every swap; then the best swap of
each heavy GPU no step touched yet, with a partner nobody uses. Every step after the first
needs ``_KEEP`` of the round's best score, so a round takes only steps that rank near the
top anyway; steps on disjoint GPUs do not change each other's scores.

The breadth constants below (candidate experts, partner slots, re-points per round, two heavy
GPUs, a free step priced at a quarter move) were tuned on the simulator's drift at 58x256 /
64x5, checked on seeds 0-3 and other windows: 11.5 % -> 10.3 % of copies moved there for the
same balance, fewer on every benchmark case, at about 1.6x the time of the narrower search.

A layer stops once its balancedness is at or below its level (``levels [L]``), or when no
step lowers its excess. The states at round boundaries are recorded as ``search.Trajectory``
points, so the selection (``selection.py``) picks per layer how far to go, as for
``local_search``.

Shapes: L layers, A active, E experts, G GPUs, S slots per GPU, N = G*S slots.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from controlplane.balancing.costs import GAIN, LOSE, pair_cost
from controlplane.balancing.placement import gpu_expert_counts, replica_counts, take_rows
from controlplane.balancing.search import Trajectory, apply_steps, move_state, receive_weight

__all__ = ["repair_search"]

_COUNT_WEIGHT = 0.06  # each GPU above the level also counts this share of the level
_Y_CHOICES = 32  # candidate experts for a re-point, by the excess their extra replica removes
_PARTNER_SLOTS = 160  # slots of the lightest GPUs a heavy GPU may swap with, about
_HEAVY = 2  # most heavy GPUs that take a swap in one round, per layer (at most G / 8)
_SOURCES = 24  # slots a re-point may take, per layer and round (the cheapest donors)
_KEEP = 0.4  # a further step of a round needs this share of the round's best score
_REPOINTS = 32  # most re-points of a layer in one round (touching disjoint GPUs)
_MIN_COST = 0.25  # a step that costs no move is scored as if it cost a quarter of a move
_EPS = 1e-9  # relative: a step must lower the excess by more than this share of the mean


def _excess(load: np.ndarray, level: np.ndarray, cw=None) -> np.ndarray:
    """Excess of each GPU over the level, plus ``cw`` (tokens, broadcast) for each GPU above
    it: the search's potential (None: excess alone)."""
    if cw is not None:
        return np.maximum(load - level, 0.0) + cw * (load > level)
    return np.maximum(load - level, 0.0)


def repair_search(
    loads: np.ndarray,
    start: np.ndarray,
    gpus: int,
    *,
    reference: np.ndarray,
    levels: np.ndarray,
    node_of_gpu: np.ndarray | None = None,
    cross_weight: float = 0.0,
    max_rounds: int,
) -> Trajectory:
    """Repair ``start [L, G*S]`` for ``loads [L, E]`` (float64, >= 0) toward ``levels [L]``
    (balancedness), counting moves against ``reference [L, G*S]``.

    ``node_of_gpu [G]``: node of each GPU (None: one node); a move whose expert no GPU of the
    destination's node held in the reference costs ``1 + cross_weight``. Returns the visited
    states (``Trajectory``: steps and points as ``local_search`` records them).
    """
    w = np.asarray(loads, dtype=np.float64)
    num_layers, num_experts = w.shape
    num_slots = start.shape[1]
    spg = num_slots // gpus
    phy = start.copy()
    cnt = gpu_expert_counts(phy, gpus, num_experts).astype(np.int32)
    rc = replica_counts(phy, num_experts)
    slot_gpu = np.arange(num_slots) // spg
    ref_has, moves, received, node_has, code, tables = move_state(
        cnt, start, reference, node_of_gpu, cross_weight
    )
    heavy = max(1, min(_HEAVY, gpus // 8))
    n_part = min(-(-_PARTNER_SLOTS // spg), gpus - heavy)
    n_y = min(_Y_CHOICES, num_experts)
    done_steps = np.zeros(num_layers, dtype=np.int64)
    steps_log: list[tuple[np.ndarray, ...]] = []
    points_log: list[tuple[np.ndarray, ...]] = []
    active = np.arange(num_layers)
    count_w = np.full(num_layers, float(_COUNT_WEIGHT))  # per layer; 0 after a fallback
    prev_phi = np.full(num_layers, np.inf)  # each layer's potential after its last round

    for round_no in range(max_rounds + 1):
        ph, wa, ca = phy[active], w[active], rc[active]
        n_act = len(active)
        rows = np.arange(n_act)
        rw = rows[:, None]
        wx = take_rows(wa, ph)
        cx = take_rows(ca, ph)
        per = wx / cx  # [A, N]
        lg = per.reshape(n_act, gpus, spg).sum(axis=2)  # [A, G]
        mean = lg.sum(axis=1) / gpus
        loaded = mean > 0
        safe = np.where(loaded, mean, 1.0)
        bal = np.where(loaded, lg.max(axis=1) / safe, 1.0)
        points_log.append((active, done_steps[active], moves[active], bal))
        go = (levels[active] < bal * (1 - 1e-12)) & loaded  # the rest are done
        # a layer whose potential did not drop falls back to the excess alone, and stops
        # when that does not drop either (see the module docstring)
        lev_all = (levels[active] * mean)[:, None]
        phi = _excess(lg, lev_all, (count_w[active] * levels[active] * mean)[:, None]).sum(axis=1)
        worse = phi > prev_phi[active] - _EPS * mean  # a round's steps must lower it
        soft = worse & (count_w[active] > 0)
        if soft.any():
            count_w[active[soft]] = 0.0
            phi[soft] = _excess(lg[soft], lev_all[soft]).sum(axis=1)
        prev_phi[active] = phi
        go &= ~(worse & ~soft)
        if round_no == max_rounds or gpus < 2 or not go.any():
            break
        keep = np.nonzero(go)[0]
        if len(keep) < n_act:
            active, ph, wa, ca, wx, cx, per, lg, mean = (
                v[keep] for v in (active, ph, wa, ca, wx, cx, per, lg, mean)
            )
            n_act = len(active)
            rows = np.arange(n_act)
            rw = rows[:, None]
        lev = (levels[active] * mean)[:, None]  # [A, 1] tokens
        cw = (count_w[active] * levels[active] * mean)[:, None] if _COUNT_WEIGHT else None
        cw3 = None if cw is None else cw[:, :, None]
        cw4 = None if cw is None else cw[:, :, None, None]
        exc = _excess(lg, lev, cw)  # [A, G]
        eps = _EPS * mean
        gpu_weight = receive_weight(received)
        if tables is not None:
            tables.update(code, gpu_weight)

        cost = partial(_cost, tables, (code, node_has, node_of_gpu, cross_weight, gpu_weight))

        # --- re-points: any slot whose expert has >= 2 replicas -> a candidate expert y
        g_of = slot_gpu[None, :]
        c_slot = cnt.ravel()[((active[:, None] * gpus + g_of) * num_experts + ph)]  # [A, N]
        ls = lg[rw, g_of]  # [A, N] load of each slot's GPU
        es = exc[rw, g_of]
        multi = cx > 1
        dx_up = np.where(multi, wx / np.maximum(cx - 1, 1) - per, 0.0)  # rise per copy
        dy_down = wx / cx - wx / (cx + 1)  # drop per copy if the slot's expert gains one
        u_slot = es - _excess(ls + c_slot * dx_up, lev, cw)  # <= 0: the slot's GPU, x losing one
        b_slot = es - _excess(ls - c_slot * dy_down, lev, cw)  # >= 0: the GPU, x gaining one
        flat_e = (rw * num_experts + ph).ravel()
        size = n_act * num_experts
        big_u = np.bincount(flat_e, weights=(u_slot / c_slot).ravel(), minlength=size)
        big_b = np.bincount(flat_e, weights=(b_slot / c_slot).ravel(), minlength=size)
        big_u = big_u.reshape(n_act, num_experts)
        big_b = big_b.reshape(n_act, num_experts)
        ycand = np.argpartition(-big_b, n_y - 1, axis=1)[:, :n_y]  # [A, K]
        by = take_rows(big_b, ycand)
        wy = take_rows(wa, ycand)
        ry = take_rows(ca, ycand).astype(np.float64)
        # sources: the ``_SOURCES`` slots whose expert's loss costs the least excess (x's
        # other holders rising, less the slot's GPU shedding its share), before any y
        ux_all = take_rows(big_u, ph) - u_slot  # [A, N] x's other holders rise
        shed = es - _excess(ls - per, lev, cw)  # the slot's GPU without its share of x
        pre = np.where(multi, ux_all + shed, -np.inf)
        n_src = min(_SOURCES, num_slots)
        src = np.argpartition(-pre, n_src - 1, axis=1)[:, :n_src]  # [A, R] slots
        src_ok = take_rows(multi, src)
        g0 = slot_gpu[src]
        xs = take_rows(ph, src)
        wxs, rxs = take_rows(wx, src), take_rows(cx, src).astype(np.float64)
        c0x = take_rows(c_slot, src).astype(np.float64)
        l0 = take_rows(ls, src)
        e0 = take_rows(es, src)
        ux = take_rows(ux_all, src)
        g0_base = (active[:, None] * gpus + g0) * num_experts  # [A, R]
        c0y = cnt.ravel()[g0_base[:, :, None] + ycand[:, None, :]].astype(np.float64)
        dy3 = (wy / ry - wy / (ry + 1))[:, None, :]
        l0_3, e0_3, lev3 = l0[:, :, None], e0[:, :, None], lev[:, :, None]
        b0 = e0_3 - _excess(l0_3 - c0y * dy3, lev3, cw3)  # y's drop on g0, counted in by
        new0 = (l0 - c0x * wxs / rxs + (c0x - 1) * wxs / np.maximum(rxs - 1, 1))[:, :, None]
        new0 = new0 - c0y * (wy / ry)[:, None, :] + (c0y + 1) * (wy / (ry + 1))[:, None, :]
        d_rp = ux[:, :, None] + (by[:, None, :] - b0) + e0_3 - _excess(new0, lev3, cw3)
        lid = active[:, None, None]
        c_rp = cost(lid, g0[:, :, None], ycand[:, None, :], GAIN)
        c_rp -= cost(lid, g0[:, :, None], xs[:, :, None], LOSE)
        ok_rp = src_ok[:, :, None] & (ycand[:, None, :] != xs[:, :, None])
        ok_rp &= d_rp > eps[:, None, None]
        s_rp = np.where(ok_rp, d_rp / np.maximum(c_rp, _MIN_COST), 0.0).reshape(n_act, -1)
        score_rp = s_rp.max(axis=1)

        # --- swaps: each heavy GPU above the level with a slot of the lightest GPUs
        by_load = np.argsort(lg, axis=1, kind="stable")
        hv = by_load[:, -heavy:][:, ::-1]  # [A, H] heaviest first
        part = by_load[:, :n_part]  # [A, M]
        sa = (hv[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, H*S]
        js = (part[:, :, None] * spg + np.arange(spg)).reshape(n_act, -1)  # [A, J]
        bj = js // spg
        n_j = js.shape[1]
        xa = take_rows(ph, sa).reshape(n_act, heavy, spg)
        pa = take_rows(per, sa).reshape(n_act, heavy, spg)
        xj, pj = take_rows(ph, js), take_rows(per, js)
        lh = take_rows(lg, hv)[:, :, None, None]  # [A, H, 1, 1]
        eh = _excess(lh, lev[:, :, None, None], cw4)
        lb = take_rows(lg, bj)[:, None, None, :]  # [A, 1, 1, J]
        eb = _excess(lb, lev[:, :, None, None], cw4)
        delta = pa[:, :, :, None] - pj[:, None, None, :]  # [A, H, S, J]
        lev4 = lev[:, :, None, None]
        # excess removed: eh + eb - excess(lh - delta) - excess(lb + delta), in place
        d_sw = np.subtract(lh - lev4, delta)
        if cw is not None:
            over = d_sw > 0
        np.maximum(d_sw, 0.0, out=d_sw)
        if cw is not None:
            np.add(d_sw, cw4, out=d_sw, where=over)
        up = np.add(delta, lb - lev4)
        if cw is not None:
            np.greater(up, 0.0, out=over)
        np.maximum(up, 0.0, out=up)
        if cw is not None:
            np.add(up, cw4, out=up, where=over)
        d_sw += up
        np.subtract(eh + eb, d_sw, out=d_sw)
        lid4 = active[:, None, None, None]
        a4, xa4 = hv[:, :, None, None], xa[:, :, :, None]
        b4, xj4 = bj[:, None, None, :], xj[:, None, None, :]
        # "b gains a's expert" is the same for every slot of b: per partner GPU, repeated
        c_sw = np.repeat(cost(lid4, part[:, None, None, :], xa4, GAIN), spg, axis=3)
        c_sw += cost(lid4, a4, xj4, GAIN)
        c_sw -= cost(lid4, a4, xa4, LOSE)
        c_sw -= cost(lid4, b4, xj4, LOSE)
        ok_sw = (delta > 0) & (xa4 != xj4) & (d_sw > eps[:, None, None, None])
        s_sw = np.where(ok_sw, d_sw / np.maximum(c_sw, _MIN_COST), 0.0)
        score_sw = s_sw.reshape(n_act, -1).max(axis=1)

        # per layer: the re-point when it beats every swap, then the swaps of the heavy GPUs
        # it leaves alone (it touches its slot's GPU and the holders of both experts), each
        # with a partner it leaves alone too and no other swap uses
        take_rp = (score_rp > score_sw) & (score_rp > 0)
        top = np.maximum(score_rp, score_sw)  # the layer's best score this round
        parts: list[tuple[np.ndarray, ...]] = []
        taken = np.zeros((n_act, gpus), dtype=bool)
        # re-points: the best source of each candidate expert, best first, each taken when
        # it touches no GPU an earlier step of the round touches
        s3 = s_rp.reshape(n_act, -1, n_y)
        k_src = np.argmax(s3, axis=1)  # [A, K]
        k_score = np.take_along_axis(s3, k_src[:, None, :], axis=1)[:, 0, :]
        rank = np.argsort(-k_score, axis=1, kind="stable")
        g_base = (active[:, None] * gpus + np.arange(gpus)) * num_experts  # [A, G]
        for q in range(min(_REPOINTS, n_y)):
            k = rank[:, q]
            sc = k_score[rows, k]
            s_q = src[rows, k_src[rows, k]]
            y_q = ycand[rows, k]
            x_q = ph[rows, s_q]
            touch = (cnt.ravel()[g_base + x_q[:, None]] > 0) | (cnt.ravel()[g_base + y_q[:, None]] > 0)
            touch[rows, slot_gpu[s_q]] = True
            ok = take_rp & (sc > 0) & (sc >= _KEEP * top) & ~(touch & taken).any(axis=1)
            r = np.nonzero(ok)[0]
            if r.size == 0:
                break
            parts.append((r, s_q[r], y_q[r], np.full(r.size, -1), np.full(r.size, -1)))
            taken[r] |= touch[r]
        for h in range(heavy):
            sc = np.where(taken[rw, bj][:, None, :], 0.0, s_sw[:, h]).reshape(n_act, -1)
            best = np.argmax(sc, axis=1)
            r = np.nonzero(~taken[rows, hv[:, h]] & (sc[rows, best] > 0)
                           & (sc[rows, best] >= _KEEP * top))[0]
            if r.size == 0:
                continue
            i, j = np.divmod(best[r], n_j)
            taken[r, bj[r, j]] = True
            parts.append((r, sa[r, h * spg + i], xj[r, j], js[r, j], xa[r, h, i]))
        if not parts:
            stuck = active[count_w[active] > 0]  # try again on the excess alone
            if stuck.size == 0:
                break
            count_w[stuck] = 0.0
            prev_phi[stuck] = np.inf
            active = stuck
            continue
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        order = np.argsort(cols[0], kind="stable")  # by layer: re-point or heaviest swap first
        r_of, s1, e1, s2, e2 = (c[order] for c in cols)
        layers = active[r_of]
        steps_log.append((layers, s1, e1, s2, e2))
        step_moves, gained = apply_steps(phy, cnt, code, rc, ref_has, layers, s1, e1, s2, e2,
                                         slot_gpu, gpus, num_experts)
        received += gained
        moves += np.bincount(layers, weights=step_moves, minlength=num_layers)
        done_steps += np.bincount(layers, minlength=num_layers)
        stepped = np.bincount(r_of, minlength=n_act) > 0
        stuck = ~stepped & (count_w[active] > 0)
        count_w[active[stuck]] = 0.0
        prev_phi[active[stuck]] = np.inf
        active = active[stepped | stuck]

    return Trajectory.from_logs(start, steps_log, points_log)


def _cost(tables, args, lid, g, e, which):
    """Weighted cost of gaining (``which = GAIN``) or losing (``LOSE``) expert ``e`` on GPU
    ``g`` of layer ``lid`` (index arrays, broadcast): from ``tables`` (a ``CostTables``
    updated for the round) when there are tables, else ``pair_cost(*args, ...)``."""
    if tables is None:
        return pair_cost(*args, lid, g, e, which)
    _, gpus, num_experts = args[0].shape
    table = tables.gain if which == GAIN else tables.lose
    return table[(lid * gpus + g) * num_experts + e]
