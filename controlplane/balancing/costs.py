"""Weighted move cost of changing one (layer, GPU, expert) pair, for the local search.

``code [L, G, E]`` int16 = 2 * replicas of the expert on the GPU + (GPU held the expert in
the reference). Gaining an expert where ``code == GAIN`` (0) is a move; losing it where
``code == LOSE`` (2: the only replica, not in the reference) removes a move; any other change
costs nothing. A move's weight is ``gpu_weight [G]`` of its GPU (None: 1) times ``1 +
cross_weight`` when no GPU of that node held the expert in the reference (``node_has [L,
nodes, E]``; None: one node).

Two ways to look a cost up, with bitwise the same result: ``pair_cost`` gathers and combines
the pieces for the pairs asked (large layouts), ``CostTables`` computes the cost of every pair
once per search round (small layouts, where the per-call overhead of the gathers dominates)
and answers with one gather by flat ``[L, G, E]`` index.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GAIN", "LOSE", "CostTables", "pair_cost", "use_tables"]

GAIN, LOSE = 0, 2  # codes: gaining the expert is a move / losing it removes a move
_WHICH = np.array([GAIN, LOSE], dtype=np.int16).reshape(2, 1, 1, 1)
_TABLE_MAX = 1 << 16  # largest L*G*E for which whole tables are rebuilt every round


def use_tables(code: np.ndarray) -> bool:
    """Whether ``CostTables`` (rebuilt every round) is cheaper than gathers for ``code``."""
    return code.size <= _TABLE_MAX


def pair_cost(code, node_has, node_of_gpu, cross_weight, gpu_weight, lid3, g, e, which):
    """Weighted cost where ``code == which`` of the pairs (layer ``lid3``, GPU ``g``, expert
    ``e``) (index arrays, broadcast together), else 0: float64 of their broadcast shape.
    Flat gathers: no multi-index checks."""
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


class CostTables:
    """``pair_cost`` of every (layer, GPU, expert), as flat float64 ``[L*G*E]`` tables.

    ``node_has [L, nodes, E]`` and ``node_of_gpu [G]`` are fixed for a search; ``update``
    rebuilds the tables for the round's ``code`` and ``gpu_weight``. ``gain[k]`` /
    ``lose[k]``: the cost of flat index ``k = (layer * G + gpu) * E + expert`` for ``which =
    GAIN`` / ``LOSE``. Each entry is computed by the same float operations, in the same
    order, as ``pair_cost``.
    """

    def __init__(self, node_has, node_of_gpu, cross_weight):
        # 1 + cross_weight * (node lacked the expert), per (layer, GPU, expert); None: 1
        self._node = None
        if node_has is not None:
            self._node = 1.0 + cross_weight * ~node_has[:, node_of_gpu, :]
        self.gain = self.lose = None

    def update(self, code: np.ndarray, gpu_weight: np.ndarray | None) -> None:
        # both tables in one pass: [2, L, G, E], GAIN then LOSE
        hit = code == _WHICH
        out = hit.astype(np.float64) if self._node is None else self._node * hit
        if gpu_weight is not None:
            out *= gpu_weight[:, None]
        self.gain, self.lose = out.reshape(2, -1)
