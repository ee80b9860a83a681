"""Expert loads of a simulated MoE policy by RL phase (pure: numpy, a seed).

The policy has one expert popularity per layer for training (a Dirichlet draw, mildly
uneven) and another for rollout: training's tilted by ``exp(tilt * z)``, z one normal draw per
expert and layer, so that generation crowds a few experts that training uses little (decoding
the policy's own samples routes differently from training on whole sequences). A span of
``generate`` routes its duration times the batched decode rate in tokens, a span of
``train_update`` its duration times the training rate; each token picks ``top_k`` experts,
drawn as one multinomial per layer (``top_k`` picks with replacement: close to distinct top-k
picks when no expert takes a large share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.agents.sim.rl import RLSimConfig
from moeplane.controlplane.rl.phases import PHASE_CODE, Spans


@dataclass(frozen=True)
class MoEPolicy:
    layers: int = 4  # L MoE layers
    experts: int = 16  # E per layer
    top_k: int = 2
    tilt: float = 1.5  # how far rollout's routing departs from training's
    seed: int = 0

    def popularity(self) -> dict[str, np.ndarray]:
        """phase name -> float64 [L, E] each layer's routing probabilities (rows sum to 1)."""
        rng = np.random.default_rng(self.seed)
        train = rng.dirichlet(np.full(self.experts, 4.0), size=self.layers)
        rollout = train * np.exp(self.tilt * rng.standard_normal((self.layers, self.experts)))
        return {"train_update": train, "generate": rollout / rollout.sum(axis=1, keepdims=True)}


def phase_loads(spans: Spans, cfg: RLSimConfig, policy: MoEPolicy, seed: int = 0
                ) -> list[tuple[int, int, str, np.ndarray]]:
    """(step, rank, phase, counts int64 [L, E]) for each (step, rank) with ``generate`` or
    ``train_update`` spans in ``spans``, summed over that step's spans of the phase."""
    rng = np.random.default_rng(seed)
    popularity = policy.popularity()
    rates = {"generate": cfg.gen_tokens_per_s, "train_update": cfg.train_tokens_per_s}
    out = []
    for name, rate in rates.items():
        mine = (spans.phase == PHASE_CODE[name]) & (spans.rank >= 0)
        keys = np.stack([spans.step[mine], spans.rank[mine]], axis=1)
        seconds = (spans.end - spans.start)[mine]
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=seconds, minlength=len(uniq))
        for (step, rank), s in zip(uniq.tolist(), totals.tolist(), strict=True):
            picks = int(round(s * rate)) * policy.top_k
            if picks:
                counts = np.stack([rng.multinomial(picks, p) for p in popularity[name]]).astype(np.int64)
                out.append((int(step), int(rank), name, counts))
    return out
