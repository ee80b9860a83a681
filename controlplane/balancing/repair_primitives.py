"""Scalar helpers of the repair search's compiled loops (:mod:`.repair_kernel`): excess over
the level, move costs, top-k selection, candidate buffers, per-GPU loads and holder tables.
They take scalars where they sit in the innermost loops (see :mod:`.repair_kernel`)."""

from __future__ import annotations

import numpy as np
from numba import njit


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
