"""Study, not the planner: how many moves a slow, exhaustive excess-greedy needs per layer.

    .venv/bin/python benchmarks/planner_repair_study.py [--family sim] [--gpus 64 --slots 5]
                                                        [--layers 0-57] [--cycles]

Per layer, from the stale plan of the incremental benchmark case (current = EPLB plan of
steps 0-19, loads = mean of steps 50-69), repeatedly take the one step with the most excess
removed per move, ``sum_g max(0, load_g - level)`` with level = EPLB's greedy + 0.01 on the
new loads, until no GPU is above the level. Candidates, every one evaluated exactly:

- swaps of a slot of any GPU above the level with a slot of the 12 lightest GPUs;
- re-points of any slot whose expert has >= 2 replicas to any other expert;
- with ``--cycles``, 3-cycles: a slot of GPU a above the level goes to GPU b above the level,
  a slot of b to one of the 24 lightest GPUs c, and a slot of c to a (three moves that can
  relieve two GPUs; a swap relieves one for two moves).

This is what ``moeplane.controlplane.balancing.repair`` (``search="repair"``, the default) approximates
with fewer candidates per evaluation (compiled, several disjoint steps per evaluation). The
3-cycles are not in it: three vectorized versions bought at most 0.6 points of the 2 this
study shows (see docs/bench-planner.md, fourth round).
Python loops: about 1 s per layer without cycles, 3 s with them. Prints the moves as a
share of the slots and the balancedness reached, beside the planner's plans.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.planner_traces import drifting_trace, workload_trace  # noqa: E402
from moeplane.controlplane.balancing import (  # noqa: E402
    count_moves,
    eplb_greedy,
    gpu_loads,
    layer_balancedness,
    plan_placement,
)

PARTNERS = 12  # lightest GPUs a swap may use
CYCLE_LIGHT = 24  # lightest GPUs a 3-cycle may pass through


class _Layer:
    """One layer's placement ``ph [N]``, replica counts per (GPU, expert) and the reference."""

    def __init__(self, w, cur, gpus, slots):
        self.w, self.gpus, self.slots = w, gpus, slots
        self.ph = cur.copy()
        self.gpu_of = np.arange(gpus * slots) // slots
        self.cnt = np.zeros((gpus, len(w)), dtype=np.int64)
        np.add.at(self.cnt, (self.gpu_of, self.ph), 1)
        self.held = self.cnt > 0

    def rc(self):
        return self.cnt.sum(axis=0)

    def loads(self):
        return (self.cnt * (self.w / self.rc())).sum(axis=1)

    def moves(self):
        return int(((self.cnt > 0) & ~self.held).sum())

    def set(self, slot, expert):
        self.cnt[self.gpu_of[slot], self.ph[slot]] -= 1
        self.ph[slot] = expert
        self.cnt[self.gpu_of[slot], expert] += 1


def _best_swap(st, load, level, over, gain, lose, per):
    best = (0.0, None)
    part = np.argsort(load)[:PARTNERS]
    oth = np.nonzero(np.isin(st.gpu_of, part))[0]
    b = st.gpu_of[oth]
    for a in over:
        sa = np.arange(a * st.slots, (a + 1) * st.slots)
        d = per[sa][:, None] - per[oth][None, :]
        before = max(load[a] - level, 0) + np.maximum(load[b] - level, 0)[None, :]
        after = np.maximum(load[a] - d - level, 0) + np.maximum(load[b][None, :] + d - level, 0)
        xa, xj = st.ph[sa][:, None], st.ph[oth][None, :]
        mv = gain[b[None, :], xa] + gain[a, xj] - lose[a, xa] - lose[b[None, :], xj]
        sc = np.where((before - after > 1e-12) & (xa != xj), (before - after) / np.maximum(mv, 0.5), 0)
        k = int(np.argmax(sc))
        if sc.flat[k] > best[0]:
            i, j = divmod(k, len(oth))
            best = (float(sc.flat[k]), ("swap", sa[i], oth[j]))
    return best


def _best_repoint(st, load, level, phi, gain, lose):
    best = (0.0, None)
    w, rc = st.w, st.rc()
    for s in np.nonzero(rc[st.ph] >= 2)[0]:
        x, g0 = st.ph[s], st.gpu_of[s]
        cx = st.cnt[:, x].astype(float)
        cx_after = cx.copy()
        cx_after[g0] -= 1
        base = load + cx_after * w[x] / (rc[x] - 1) - cx * w[x] / rc[x]
        cy = st.cnt.T.astype(float)  # [E, G]
        cy_after = cy.copy()
        cy_after[:, g0] += 1
        new = base[None, :] + cy_after * (w / (rc + 1))[:, None] - cy * (w / rc)[:, None]
        new[x] = np.inf
        removed = phi - np.maximum(new - level, 0).sum(axis=1)
        mv = gain[g0] - lose[g0, x]
        sc = np.where(removed > 1e-12, removed / np.maximum(mv, 0.5), 0)
        y = int(np.argmax(sc))
        if sc[y] > best[0]:
            best = (float(sc[y]), ("repoint", s, y))
    return best


def _best_cycle(st, load, level, over, gain, lose, per):
    best = (0.0, None)
    light = np.argsort(load)[:CYCLE_LIGHT]
    sl = (light[:, None] * st.slots + np.arange(st.slots)).ravel()
    for a in over:
        sa = np.arange(a * st.slots, (a + 1) * st.slots)
        for b in over:
            if b == a:
                continue
            sb = np.arange(b * st.slots, (b + 1) * st.slots)
            sc_ = sl[(st.gpu_of[sl] != a) & (st.gpu_of[sl] != b)]
            c = st.gpu_of[sc_][None, None, :]
            px, py, pz = per[sa][:, None, None], per[sb][None, :, None], per[sc_][None, None, :]
            before = (max(load[a] - level, 0) + max(load[b] - level, 0)
                      + np.maximum(load[c] - level, 0))
            after = (np.maximum(load[a] - px + pz - level, 0)
                     + np.maximum(load[b] - py + px - level, 0)
                     + np.maximum(load[c] - pz + py - level, 0))
            x, y, z = st.ph[sa][:, None, None], st.ph[sb][None, :, None], st.ph[sc_][None, None, :]
            mv = (gain[b, x] + gain[c, y] + gain[a, z]
                  - lose[a, x] - lose[b, y] - lose[c, z])
            ok = (before - after > 1e-12) & (x != y) & (y != z) & (x != z)
            sc = np.where(ok, (before - after) / np.maximum(mv, 0.5), 0)
            k = int(np.argmax(sc))
            if sc.flat[k] > best[0]:
                i, j, m = np.unravel_index(k, sc.shape)
                best = (float(sc.flat[k]), ("cycle", sa[i], sb[j], sc_[m]))
    return best


def repair_layer(w, cur, gpus, slots, level, cycles, max_steps=500):
    """Excess-greedy on one layer: ``w [E]``, ``cur [G*S]``, ``level`` in tokens. Returns the
    placement ``[G*S]`` reached."""
    st = _Layer(w, cur, gpus, slots)
    for _ in range(max_steps):
        load = st.loads()
        phi = float(np.maximum(load - level, 0).sum())
        if phi <= 0:
            break
        per = w[st.ph] / st.rc()[st.ph]
        over = np.nonzero(load > level)[0]
        gain = ((st.cnt == 0) & ~st.held).astype(float)
        lose = ((st.cnt == 1) & ~st.held).astype(float)
        found = [_best_swap(st, load, level, over, gain, lose, per),
                 _best_repoint(st, load, level, phi, gain, lose)]
        if cycles and len(over) >= 2:
            found.append(_best_cycle(st, load, level, over, gain, lose, per))
        score, step = max(found, key=lambda f: f[0])
        if step is None:
            break
        if step[0] == "swap":
            _, s1, s2 = step
            x1, x2 = st.ph[s1], st.ph[s2]
            st.set(s1, x2)
            st.set(s2, x1)
        elif step[0] == "repoint":
            st.set(step[1], step[2])
        else:
            _, s_a, s_b, s_c = step
            x, y, z = st.ph[s_a], st.ph[s_b], st.ph[s_c]
            st.set(s_a, z)
            st.set(s_b, x)
            st.set(s_c, y)
    return st.ph


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("sim", "walk"), default="sim")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--slots", type=int, default=5)
    parser.add_argument("--layers", default="0-57", help="first-last layer of the 58 (e.g. 0-3)")
    parser.add_argument("--cycles", action="store_true", help="also 3-cycles")
    args = parser.parse_args(argv)
    first, last = (int(v) for v in args.layers.split("-"))
    gpus, slots, experts = args.gpus, args.slots, 256
    if args.family == "sim":
        trace = workload_trace(70, 58, experts, gpus=gpus, top_k=8, seed=0)
    else:
        trace = drifting_trace(70, 58, experts, tokens_per_layer=gpus * 16384 * 8, seed=0)
    rows = slice(first, last + 1)
    old, new = trace[:20].mean(axis=0)[rows], trace[50:70].mean(axis=0)[rows]
    cur = eplb_greedy(old, gpus, slots)
    fresh = layer_balancedness(gpu_loads(new, eplb_greedy(new, gpus, slots), gpus))
    out = cur.copy()
    for lay in range(new.shape[0]):
        level = (fresh[lay] + 0.01) * new[lay].sum() / gpus
        out[lay] = repair_layer(new[lay], cur[lay], gpus, slots, level, args.cycles)
    n_slots = new.shape[0] * gpus * slots
    rows_out = [("study (cycles)" if args.cycles else "study", out)]
    for search in ("relieve", "repair"):
        plan = plan_placement(new, gpus=gpus, slots_per_gpu=slots, nodes=max(1, gpus // 8),
                              current=cur, search=search)
        rows_out.append((f"plan_placement search={search}", plan.phy2log))
    print(f"{args.family} layers {first}-{last} on {gpus}x{slots}: fresh EPLB bal {fresh.mean():.4f}")
    for name, phy in rows_out:
        moves = count_moves(cur, phy, gpus, experts).sum()
        bal = layer_balancedness(gpu_loads(new, phy, gpus)).mean()
        print(f"  {name}: {moves} moves ({moves / n_slots:.1%}), balancedness {bal:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
