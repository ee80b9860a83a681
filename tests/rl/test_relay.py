"""The node agent merges its ranks' RL reports into one per flush."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents.rlrelay import RLRelay
from moeplane.agents.rlreport import rl_report
from moeplane.controlplane.rl.phases import Spans
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array, encode_array


def _rank(rank: int, phases: list[str]) -> pb.RLReport:
    n = len(phases)
    spans = Spans.build([7] * n, [rank] * n, [3] * n, phases, ["rollout"] * n, np.arange(n) + rank,
                        np.arange(n) + rank + 0.5, [rank] * n)
    return rl_report("job", spans, batches=[pb.ConsumedBatch(step=7, rank=rank, trained_version=3)])


def _named(report: pb.RLReport) -> list[tuple]:
    s = report.spans
    phase, rank = decode_array(s.phase, "p", kinds="iu"), decode_array(s.rank, "r", kinds="iu")
    start = decode_array(s.start, "s")
    return sorted((int(r), float(t), s.phase_names[p]) for r, t, p in zip(rank, start, phase, strict=True))


def test_reports_of_ranks_merge_into_one_message():
    sent: list[pb.AgentMessage] = []
    relay = RLRelay(sent.append)
    a, b = _rank(0, ["generate", "wait"]), _rank(1, ["train_update"])
    b.spans.ClearField("phase_names")  # rank 1 names its phases in its own order
    b.spans.phase_names.extend(["dream", "train_update"])
    b.spans.phase.CopyFrom(encode_array(np.array([1], dtype=np.uint8)))
    relay.add(a)
    relay.add(b)
    assert sent == []
    relay.flush()
    assert len(sent) == 1
    merged = sent[0].rl
    assert _named(merged) == _named(a) + [(1, 1.0, "train_update")]
    assert [x.rank for x in merged.batches] == [0, 1]
    relay.flush()
    assert len(sent) == 1  # nothing pending: nothing sent


def test_a_malformed_report_is_refused_whole():
    relay = RLRelay(lambda m: None)
    bad = _rank(0, ["generate", "wait"])
    bad.spans.end.CopyFrom(encode_array(np.zeros(3)))
    with pytest.raises(ValueError, match="rl.spans.end"):
        relay.add(bad)


def test_phase_loads_of_ranks_travel_in_the_merged_report():
    from moeplane.agents.rlreport import phase_loads

    sent: list[pb.AgentMessage] = []
    relay = RLRelay(sent.append)
    counts = {r: np.arange(12).reshape(3, 4) * (r + 1) for r in (0, 1)}
    for r in (0, 1):
        relay.add(rl_report("job", loads=[phase_loads(7, r, "generate", counts[r], 100.0 + r)]))
    relay.flush()
    merged = sent[0].rl.phase_loads
    assert [(p.rank, p.phase, p.step) for p in merged] == [(0, "generate", 7), (1, "generate", 7)]
    for p in merged:
        assert np.array_equal(decode_array(p.counts, "c", kinds="iu"), counts[p.rank])
    # a report's worth of counts past max_load_bytes goes at once
    small = RLRelay(sent.append, max_load_bytes=2 * 12 * 4)
    small.add(rl_report("job", loads=[phase_loads(8, 0, "generate", counts[0], 1.0)]))
    assert len(sent) == 1
    small.add(rl_report("job", loads=[phase_loads(8, 1, "generate", counts[1], 1.0)]))
    assert len(sent) == 2 and [p.rank for p in sent[1].rl.phase_loads] == [0, 1]
