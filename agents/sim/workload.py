"""Synthetic MoE routing workload that looks like real training.

Pure and seeded: no I/O, no clock. One :class:`ExpertLoadModel` holds the latent expert
popularity of every layer and advances it one training step at a time.

Shape of the model (all per layer ``l`` and logical expert ``e``):

- popularity ``p[l, :] = softmax(z[l, :])`` with latent logits ``z = base + drift``;
- ``base`` is skewed (log-normal popularity) and a few *hot* experts get a large boost, so the
  hottest experts carry several times the mean load;
- adjacent layers are correlated: each layer's latent is an AR(1) step from the previous
  layer's (``layer_correlation``), and hot experts tend to repeat in the next layer;
- ``drift`` is a stationary AR(1) process over steps whose rate decays from
  ``drift_rate_early`` to ``drift_rate_late`` with time constant ``drift_tau_steps`` (fast
  early in training, slow later);
- each rank routes ``tokens_per_rank`` tokens to ``top_k`` experts per layer, drawn as a
  multinomial over ``p`` (sampling noise; top-k without replacement is approximated by k
  independent draws per token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.balancing import placement


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of the simulated job.

    layers: MoE layers L. experts: logical experts per layer E. top_k: experts per token.
    world_size: expert-parallel ranks G. tokens_per_rank: tokens each rank routes per step.
    """

    layers: int
    experts: int
    top_k: int
    world_size: int
    tokens_per_rank: int = 4096
    skew: float = 0.6
    hot_experts: int = 3
    hot_boost: float = 1.2
    layer_correlation: float = 0.7
    drift_rate_early: float = 0.15
    drift_rate_late: float = 0.01
    drift_tau_steps: float = 200.0
    drift_scale: float = 0.5

    def __post_init__(self) -> None:
        for name in ("layers", "experts", "top_k", "world_size", "tokens_per_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= experts ({self.experts})")
        if not 0.0 <= self.layer_correlation < 1.0:
            raise ValueError(f"layer_correlation must be in [0, 1), got {self.layer_correlation}")
        if not 0 <= self.hot_experts <= self.experts:
            raise ValueError(f"hot_experts must be in [0, experts], got {self.hot_experts}")


def _layer_correlated_normal(rng: np.random.Generator, layers: int, experts: int,
                             rho: float) -> np.ndarray:
    """[L, E] standard normals, AR(1)-correlated along the layer axis with coefficient rho."""
    eps = rng.standard_normal((layers, experts))
    out = np.empty_like(eps)
    out[0] = eps[0]
    scale = np.sqrt(1.0 - rho * rho)
    for layer in range(1, layers):
        out[layer] = rho * out[layer - 1] + scale * eps[layer]
    return out


class ExpertLoadModel:
    """Seeded generator of per-rank expert loads, one training step per :meth:`step` call."""

    def __init__(self, spec: WorkloadSpec, seed: int = 0):
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        L, E = spec.layers, spec.experts
        base = spec.skew * _layer_correlated_normal(self.rng, L, E, spec.layer_correlation)
        hot = self._hot_mask()
        self.base = base + spec.hot_boost * hot
        self.drift = np.zeros((L, E))
        self.steps_done = 0

    def _hot_mask(self) -> np.ndarray:
        """[L, E] 1.0 where an expert is hot; hot sets overlap between adjacent layers."""
        L, E, H = self.spec.layers, self.spec.experts, self.spec.hot_experts
        mask = np.zeros((L, E))
        if H == 0:
            return mask
        current = self.rng.choice(E, size=H, replace=False)
        for layer in range(L):
            if layer:
                keep = self.rng.random(H) < self.spec.layer_correlation
                fresh = self.rng.choice(E, size=H, replace=False)
                current = np.where(keep, current, fresh)
            mask[layer, current] = 1.0
        return mask

    def drift_rate(self, step: int) -> float:
        """Per-step innovation weight of the drift process at training step ``step``."""
        s = self.spec
        return s.drift_rate_late + (s.drift_rate_early - s.drift_rate_late) * float(
            np.exp(-step / s.drift_tau_steps)
        )

    def popularity(self) -> np.ndarray:
        """[L, E] float64 routing probabilities of the current step; rows sum to 1."""
        z = self.base + self.drift
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True)

    def step(self) -> np.ndarray:
        """Advance one step; return counts [G, L, E] int64, tokens each rank routed per expert.

        Every row ``counts[g, l]`` sums to ``tokens_per_rank * top_k``.
        """
        s = self.spec
        rate = self.drift_rate(self.steps_done)
        shock = _layer_correlated_normal(self.rng, s.layers, s.experts, s.layer_correlation)
        self.drift = np.sqrt(1.0 - rate * rate) * self.drift + rate * s.drift_scale * shock
        self.steps_done += 1
        p = self.popularity()
        n = s.tokens_per_rank * s.top_k
        # multinomial per (rank, layer): shape [G, L, E]
        return self.rng.multinomial(n, p, size=(s.world_size, s.layers)).astype(np.int64)


def identity_phy2log(layers: int, experts: int, world_size: int) -> tuple[np.ndarray, int]:
    """Initial placement: slot ``j`` holds logical expert ``j % E``.

    Returns ``(phy2log [L, G*S] int64, S)`` with ``S = ceil(E / G)`` slots per rank.
    """
    if min(layers, experts, world_size) < 1:
        raise ValueError("layers, experts and world_size must be >= 1")
    slots = -(-experts // world_size)
    return placement.identity_placement(layers, experts, world_size * slots), slots


def gpu_loads(loads: np.ndarray, phy2log: np.ndarray, world_size: int) -> np.ndarray:
    """Tokens each rank computes per layer under a placement.

    loads: [L, E] tokens routed to each logical expert. phy2log: [L, G*S] logical expert of
    each physical slot; a logical expert's tokens split evenly over its replicas.
    Returns [L, G] float64.
    """
    L, E = loads.shape
    if phy2log.ndim != 2 or phy2log.shape[0] != L or phy2log.shape[1] % world_size:
        raise ValueError(f"phy2log shape {phy2log.shape} does not fit loads {loads.shape} "
                         f"and world_size {world_size}")
    if phy2log.min() < 0 or phy2log.max() >= E:
        raise ValueError(f"phy2log holds expert ids outside [0, {E})")
    if (placement.replica_counts(phy2log, E) == 0).any():
        raise ValueError("phy2log leaves some logical expert without a slot")
    return placement.gpu_loads(loads, phy2log, world_size)


def balancedness(per_gpu: np.ndarray) -> float:
    """Mean over layers of max GPU load / mean GPU load; per_gpu [L, G]. 1.0 is perfect (also
    for a layer with no load)."""
    return float(placement.layer_balancedness(per_gpu).mean())


def step_time_s(base_step_time_s: float, balance: float, moe_fraction: float = 0.5) -> float:
    """Step time when the MoE part (``moe_fraction`` of a balanced step) is slowed by imbalance.

    The slowest rank of each layer gates the all-to-all, so the MoE part scales with
    ``balance`` (max / mean GPU load).
    """
    return base_step_time_s * ((1.0 - moe_fraction) + moe_fraction * balance)


@dataclass(frozen=True)
class Spells:
    """Recurring spells: the ``k``-th covers steps ``first + k * every`` to ``first + k * every
    + length - 1``; ``every <= 0`` means none."""

    every: int
    length: int
    first: int = 0

    def __post_init__(self) -> None:
        if self.every > 0 and not 0 < self.length <= self.every:
            raise ValueError(f"length must be in [1, every={self.every}], got {self.length}")
        if self.first < 0:
            raise ValueError(f"first must be >= 0, got {self.first}")

    def index(self, step: int) -> int | None:
        """The spell ``step`` falls in, or None."""
        if self.every <= 0 or step < self.first:
            return None
        k, into = divmod(step - self.first, self.every)
        return k if into < self.length else None


def spread_ranks(seed: int, spell: int, count: int, nodes: int, per_node: int) -> list[int]:
    """``count`` ranks for spell ``spell``, on as many different nodes as there are (seeded)."""
    rng = np.random.default_rng([seed, spell])
    picked: list[int] = []
    while len(picked) < min(count, nodes * per_node):
        for node in rng.permutation(nodes)[: count - len(picked)]:
            free = [r for r in range(node * per_node, (node + 1) * per_node) if r not in picked]
            if free:
                picked.append(int(rng.choice(free)))
    return sorted(picked)
