"""Interval arithmetic on sorted numpy arrays (seconds), for the idle analysis.

An interval set is a pair ``(starts [K], ends [K])`` of float64 arrays, sorted, disjoint and
non-empty (``starts[i] < ends[i] <= starts[i + 1]``).
"""

from __future__ import annotations

import numpy as np

EMPTY = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray, lo: float = -np.inf, hi: float = np.inf):
    """The union of intervals ``[starts[i], ends[i])`` clipped to ``[lo, hi)``, as a sorted
    disjoint interval set; empty intervals vanish."""
    s = np.clip(np.asarray(starts, dtype=np.float64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.float64), lo, hi)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def length(iv) -> float:
    return float((iv[1] - iv[0]).sum())


def covered(x: np.ndarray, iv) -> np.ndarray:
    """bool [len(x)]: whether each point lies in the interval set ``iv``."""
    s, e = iv
    if s.size == 0:
        return np.zeros(x.shape, dtype=bool)
    i = np.searchsorted(s, x, side="right") - 1
    return (i >= 0) & (x < e[np.maximum(i, 0)])

