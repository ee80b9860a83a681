"""The policy-version rule of RL ingest, on columns (no server)."""

from __future__ import annotations

import numpy as np

from moeplane.controlplane.ingest.rl import _Refusals, check_versions
from moeplane.controlplane.rl.phases import Spans


def test_versions_going_backwards_are_refused_per_rank():
    # rows: rank 0 at t=1,2,3 with versions 1,2,1 (the last goes back); rank 1 at t=20 with
    # version 5 below the stored 6 of t=10 (refused) and at t=5 with version 3 (an old span
    # resent: allowed); rank 2 has no history
    spans = Spans.build([0] * 6, [0, 1, 0, 0, 1, 2], [1, 5, 2, 1, 3, 0], ["generate"] * 6, ["hybrid"] * 6,
                        [1.0, 20.0, 2.0, 3.0, 5.0, 1.0], [1.5, 21.0, 2.5, 3.5, 6.0, 2.0], [0] * 6)
    ok = np.ones(6, dtype=bool)
    refused = _Refusals()
    check_versions(spans, ok, {1: (10.0, 6)}, refused)
    assert ok.tolist() == [True, False, True, False, True, True]
    assert refused.count == 2 and refused.field == "rl.spans.version[1]"
    assert "rank 1" in refused.problem and "version 6" in refused.problem


def test_huge_versions_do_not_overflow():
    big = 2**62
    spans = Spans.build([0, 0, 0], [0, 1, 0], [big, big - 1, big - 1], ["wait"] * 3, ["rollout"] * 3,
                        [1.0, 1.0, 2.0], [1.0, 1.0, 2.0], [0] * 3)
    ok = np.ones(3, dtype=bool)
    check_versions(spans, ok, {}, _Refusals())
    assert ok.tolist() == [True, True, False]
