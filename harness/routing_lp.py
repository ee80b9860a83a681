"""Exact reference for per-step replica routing: the linear-programming optimum of one
layer's most loaded GPU with the replicas fixed, without an LP solver.

With the replicas fixed, a layer's tokens can be divided among them so that no GPU gets more
than ``T`` tokens if and only if a flow of value ``sum(loads)`` exists in the network source ->
expert (capacity ``loads[e]``) -> every GPU holding a replica of ``e`` (unbounded) -> sink
(capacity ``T``). Feasibility is monotone in ``T``, so the LP optimum ``T*`` (fractional
division) is found by bisection on ``T`` between the mean GPU load and the total, each probe
one max-flow (Dinic). ``lp_optimum`` returns ``T*`` to a relative ``1e-9``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["lp_optimum", "max_flow"]


def max_flow(n: int, edges: list[tuple[int, int, float]], source: int, sink: int) -> float:
    """Dinic's max-flow on ``n`` nodes and directed ``edges`` (u, v, capacity >= 0)."""
    graph: list[list[int]] = [[] for _ in range(n)]
    to: list[int] = []
    cap: list[float] = []
    for u, v, c in edges:
        graph[u].append(len(to))
        to.append(v)
        cap.append(float(c))
        graph[v].append(len(to))
        to.append(u)
        cap.append(0.0)
    eps = 1e-12
    total = 0.0
    while True:
        level = [-1] * n
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for i in graph[u]:
                if cap[i] > eps and level[to[i]] < 0:
                    level[to[i]] = level[u] + 1
                    queue.append(to[i])
        if level[sink] < 0:
            return total
        it = [0] * n

        def push(u: int, f: float, level=level, it=it) -> float:
            if u == sink:
                return f
            while it[u] < len(graph[u]):
                i = graph[u][it[u]]
                v = to[i]
                if cap[i] > eps and level[v] == level[u] + 1:
                    got = push(v, min(f, cap[i]))
                    if got > eps:
                        cap[i] -= got
                        cap[i ^ 1] += got
                        return got
                it[u] += 1
            return 0.0

        while True:
            f = push(source, float("inf"))
            if f <= eps:
                break
            total += f


def lp_optimum(loads: np.ndarray, phy2log_row: np.ndarray, gpus: int) -> float:
    """Least possible max GPU load of one layer, tokens divisible freely among replicas:
    ``loads [E]`` (tokens), ``phy2log_row [G*S]`` -> float (tokens)."""
    loads = np.asarray(loads, dtype=np.float64)
    row = np.asarray(phy2log_row, dtype=np.int64)
    spg = row.size // gpus
    num_experts = loads.size
    holders = [sorted({int(q) // spg for q in np.flatnonzero(row == e)}) for e in range(num_experts)]
    total = float(loads.sum())
    if total == 0:
        return 0.0
    source, sink = num_experts + gpus, num_experts + gpus + 1
    fixed = [(source, e, float(loads[e])) for e in range(num_experts) if loads[e] > 0]
    fixed += [(e, num_experts + g, total) for e in range(num_experts) for g in holders[e]]

    def feasible(t: float) -> bool:
        edges = fixed + [(num_experts + g, sink, t) for g in range(gpus)]
        return max_flow(num_experts + gpus + 2, edges, source, sink) >= total * (1 - 1e-12)

    lo, hi = total / gpus, total
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi
