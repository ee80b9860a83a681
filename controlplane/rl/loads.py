"""Expert loads of an MoE policy by RL phase, summarized (pure).

Rollout (``generate``) and training (``train_update``) route the same policy's tokens through
the same experts, but not alike: generation decodes one token at a time over the policy's own
samples, training runs whole sequences. Comparing the two per layer and expert shows where the
expert placement tuned on one is wrong for the other.
"""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.balancing.placement import layer_balancedness
from moeplane.controlplane.rl.phases import PHASES


def summarize(phases: np.ndarray, counts: np.ndarray) -> list[dict]:
    """One entry per phase, in the order of ``phases``.

    Args:
        phases: int [P] phase codes into PHASES.
        counts: int64 [P, L, E] tokens routed to each expert of each layer during the phase.

    Returns: dicts with ``phase`` (name), ``tokens`` (int, sum of counts), ``counts`` int64
    [L, E], ``share`` float64 [L, E] (each layer's counts over its sum; 0 for a layer without
    tokens), ``max_over_mean`` float64 [L] (per layer, the busiest expert's count over the mean
    expert's; 1.0 is perfectly even, 1.0 too for a layer without tokens) and
    ``max_over_mean_avg`` (its mean over layers).
    """
    out = []
    for code, c in zip(np.asarray(phases).tolist(), counts, strict=True):
        c = np.asarray(c, dtype=np.int64)
        totals = c.sum(axis=1, keepdims=True)
        share = np.divide(c, totals, out=np.zeros(c.shape), where=totals > 0)
        imbalance = layer_balancedness(c.astype(np.float64))
        out.append({"phase": PHASES[code], "tokens": int(c.sum()), "counts": c, "share": share,
                    "max_over_mean": imbalance, "max_over_mean_avg": float(imbalance.mean()) if imbalance.size else 1.0})
    return out
