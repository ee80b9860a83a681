"""Synthetic expert-load traces for the planner benchmark and the balancing tests, two families.

``drifting_trace`` (family "random walk"): per layer, each expert has a log-popularity drawn
from N(0, skew^2) (a heavy, Zipf-like spread), which drifts as a random walk of ``drift`` per
step (mean-reverting very slowly). A step's loads are the routed tokens (``tokens_per_layer``
per layer) split by popularity, with per-step multiplicative batch noise and Poisson-like
sampling noise. Layers are independent; the drift rate is constant.

``workload_trace`` (family "sim workload"): the simulator's workload model
(``moeplane.agents.sim.workload.ExpertLoadModel``, the one ``moeplane simulate`` runs), imported, not
copied, with its default parameters: adjacent layers correlated, a few hot experts, drift
fast early in training and slow later, multinomial top-k routing per rank.
"""

from __future__ import annotations

import numpy as np

from moeplane.agents.sim.workload import ExpertLoadModel, WorkloadSpec


def drifting_trace(
    steps: int,
    layers: int,
    experts: int,
    *,
    tokens_per_layer: float,
    skew: float = 1.0,
    drift: float = 0.015,
    batch_noise: float = 0.05,
    seed: int = 0,
) -> np.ndarray:
    """Loads per step: float64 ``[steps, layers, experts]`` (tokens; sums to about
    ``tokens_per_layer`` per layer and step)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, skew, size=(layers, experts))
    out = np.empty((steps, layers, experts))
    for t in range(steps):
        theta = 0.999 * theta + rng.normal(0.0, drift, size=theta.shape)
        pop = np.exp(theta + rng.normal(0.0, batch_noise, size=theta.shape))
        mean = tokens_per_layer * pop / pop.sum(axis=1, keepdims=True)
        out[t] = np.maximum(mean + np.sqrt(mean) * rng.standard_normal(mean.shape), 0.0)
    return out


def workload_trace(
    steps: int,
    layers: int,
    experts: int,
    *,
    gpus: int,
    top_k: int,
    tokens_per_rank: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Loads per step from the simulator's model, training steps ``1 .. steps``: float64
    ``[steps, layers, experts]`` (token-expert assignments summed over the ``gpus`` ranks;
    ``gpus * tokens_per_rank * top_k`` per layer and step). Every other parameter of
    ``WorkloadSpec`` keeps its default; ``tokens_per_rank=None`` keeps that default too."""
    extra = {} if tokens_per_rank is None else {"tokens_per_rank": tokens_per_rank}
    model = ExpertLoadModel(WorkloadSpec(layers, experts, top_k, gpus, **extra), seed=seed)
    out = np.empty((steps, layers, experts))
    for t in range(steps):
        out[t] = model.step().sum(axis=0)
    return out
