"""Jittered exponential backoff ("equal jitter"). Pure: randomness comes from a seeded rng."""

from __future__ import annotations

import random


class Backoff:
    """Delays for successive reconnect attempts: uniform in [c/2, c], c = min(cap, base * 2**n)."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 10.0, seed: int | None = None):
        if base_s <= 0 or cap_s < base_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got base_s={base_s}, cap_s={cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = random.Random(seed)
        self.attempt = 0

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt; grows until :meth:`reset`."""
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return self.rng.uniform(0.5 * ceiling, ceiling) if ceiling else 0.0

    def reset(self) -> None:
        self.attempt = 0
