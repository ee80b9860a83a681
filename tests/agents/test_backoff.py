from __future__ import annotations

import pytest

from moeplane.agents.backoff import Backoff


def test_delays_grow_jittered_up_to_the_cap_and_reset():
    b = Backoff(base_s=0.1, cap_s=1.0, seed=1)
    delays = [b.next_delay() for _ in range(8)]
    ceilings = [min(1.0, 0.1 * 2**i) for i in range(8)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered
    b.reset()
    assert b.next_delay() <= 0.1
    assert [Backoff(0.1, 1.0, seed=5).next_delay() for _ in range(2)] == [
        Backoff(0.1, 1.0, seed=5).next_delay()] * 2


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match="base_s"):
        Backoff(base_s=0)
