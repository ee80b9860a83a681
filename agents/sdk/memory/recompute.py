"""Recomputation: the wrapped layer keeps only its inputs and reruns forward in backward."""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint


class RecomputedLayer(nn.Module):
    """Wraps ``inner`` in ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.

    RNG state is preserved (``preserve_rng_state=True``), so dropout masks match the forward.
    Outside training (no grad) it runs ``inner`` directly.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        if not self.training:
            return self.inner(*args, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, preserve_rng_state=True,
                          **kwargs)
