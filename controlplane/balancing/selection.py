"""Choosing, per layer, one of the placements a search visited.

Each candidate is a point (layer, moves, balancedness). Two rules, both walking the
segments of each layer's lower convex hull of (moves, balancedness):

- ``select_mean``: the steepest balance-per-move segments across layers until the mean
  balancedness reaches a goal.
- ``select_budget``: a global move budget spent on the steepest balance-per-move segments of
  each layer's lower convex hull, in one fixed order that does not depend on the budget and
  stopping at the first segment that no longer fits. A larger budget therefore takes a
  superset of segments and never ends less balanced.
"""

from __future__ import annotations

import numpy as np

__all__ = ["select_budget", "select_mean", "select_mean_slope"]


def _hull(cost: list[float], bal: list[float]) -> list[int]:
    """Lower convex hull of a Pareto front: ``cost`` increasing, ``bal`` decreasing.
    Returns positions into the front, from its first (cheapest) point."""
    hull: list[int] = []
    for i in range(len(cost)):
        while len(hull) >= 2:
            p, q = hull[-2], hull[-1]
            # drop q if it lies on or above the segment p -> i
            if (bal[q] - bal[p]) * (cost[i] - cost[p]) >= (bal[i] - bal[p]) * (cost[q] - cost[p]):
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def _segments(
    layer: np.ndarray, cost: np.ndarray, bal: np.ndarray, num_layers: int
) -> tuple[np.ndarray, list[tuple[float, int, int, float, int]]]:
    """Each layer's cheapest best point, and all hull segments, steepest first."""
    # each layer's Pareto front (fewer moves, then lower balancedness, then earlier point),
    # for all layers at once: shifting each layer's balancedness below the previous layer's
    # makes one running minimum restart at every layer
    order = np.lexsort((np.arange(len(cost)), bal, cost, layer))
    lay_s = layer[order]
    shift = 2.0 * (float(bal.max() - bal.min()) + 1.0)
    key = bal[order] - lay_s * shift
    prev_min = np.minimum.accumulate(np.concatenate([[np.inf], key[:-1]]))
    front = order[key < prev_min]
    f_layer = layer[front]
    starts = np.searchsorted(f_layer, np.arange(num_layers + 1))
    f_cost = cost[front].tolist()
    f_bal = bal[front].tolist()
    chosen = np.empty(num_layers, dtype=np.int64)
    segments: list[tuple[float, int, int, float, int]] = []
    for lay in range(num_layers):
        lo, hi = int(starts[lay]), int(starts[lay + 1])
        hull = [lo + k for k in _hull(f_cost[lo:hi], f_bal[lo:hi])]
        chosen[lay] = front[hull[0]]
        for n, (p, q) in enumerate(zip(hull, hull[1:], strict=False)):
            dcost = f_cost[q] - f_cost[p]
            ratio = (f_bal[p] - f_bal[q]) / dcost
            segments.append((-ratio, lay, n, dcost, int(front[q])))
    return chosen, sorted(segments)


def select_budget(
    layer: np.ndarray, cost: np.ndarray, bal: np.ndarray, num_layers: int, budget: int
) -> np.ndarray:
    """Index of the chosen point for each layer under a total ``budget`` of moves.

    ``layer, cost, bal [P]``: the points (every layer needs a point of cost 0). Returns int64
    ``[L]`` indices into the points; the chosen costs sum to at most ``budget``.
    """
    chosen, segments = _segments(layer, cost, bal, num_layers)
    spent = float(cost[chosen].sum())
    for _neg_ratio, lay, _n, dcost, q in segments:
        if spent + dcost > budget:
            break
        spent += dcost
        chosen[lay] = q
    return chosen


def select_mean(
    layer: np.ndarray, cost: np.ndarray, bal: np.ndarray, num_layers: int, goal: float
) -> np.ndarray:
    """Index of the chosen point for each layer: the steepest segments first, until the mean
    balancedness over layers is at or below ``goal`` (or no segment is left).

    ``layer, cost, bal [P]``: the points. Returns int64 ``[L]`` indices into the points.
    """
    return select_mean_slope(layer, cost, bal, num_layers, goal)[0]


def select_mean_slope(
    layer: np.ndarray, cost: np.ndarray, bal: np.ndarray, num_layers: int, goal: float
) -> tuple[np.ndarray, float]:
    """``select_mean``'s choice and the balance per move of the last segment it took (inf
    when it took none): segments flatter than that are not worth taking for ``goal``."""
    chosen, segments = _segments(layer, cost, bal, num_layers)
    total = float(bal[chosen].sum())
    slope = np.inf
    for neg_ratio, lay, _n, _dcost, q in segments:
        if total <= goal * num_layers:
            break
        total += float(bal[q] - bal[chosen[lay]])
        chosen[lay] = q
        slope = -neg_ratio
    return chosen, slope
