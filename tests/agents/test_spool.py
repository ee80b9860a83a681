from __future__ import annotations

import numpy as np
import pytest

from moeplane.agents import messages
from moeplane.agents.spool import Spool
from moeplane.controlplane.wire import moeplane_pb2 as pb


def sample_msg(ts: float) -> pb.AgentMessage:
    return messages.samples(ts, ["n/gpu0"], ["power_watts"], np.array([[ts]]))


def loads_msg(step: int) -> pb.AgentMessage:
    return pb.AgentMessage(loads=pb.ExpertLoads(job_id="j", step=step))


def test_seq_is_strictly_increasing_and_survives_reopen(tmp_path):
    spool = Spool(tmp_path)
    seqs = [spool.append(sample_msg(i)) for i in range(3)]
    hello = spool.allocate_seq()
    spool.close()
    spool = Spool(tmp_path)
    after = spool.append(sample_msg(9))
    assert seqs == [1, 2, 3] and hello == 4 and after == 5
    assert [s for s, _ in spool.pending()] == [1, 2, 3, 5]
    msg = pb.AgentMessage.FromString(spool.pending()[0][1])
    assert msg.seq == 1 and msg.samples.timestamp == 0


def test_ack_removes_and_pending_is_ordered_from_a_seq(tmp_path):
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(sample_msg(i))
    assert spool.ack([2, 4, 99]) == 2
    assert [s for s, _ in spool.pending()] == [1, 3, 5]
    assert [s for s, _ in spool.pending(after_seq=1, limit=1)] == [3]
    assert spool.count == 3


def test_full_spool_drops_oldest_samples_first_and_counts(tmp_path):
    spool = Spool(tmp_path, max_messages=4)
    spool.append(sample_msg(0))          # 1
    spool.append(loads_msg(0))           # 2
    spool.append(sample_msg(1))          # 3
    spool.append(loads_msg(1))           # 4
    spool.append(sample_msg(2))          # 5 -> drops 1
    spool.append(sample_msg(3))          # 6 -> drops 3
    assert [s for s, _ in spool.pending()] == [2, 4, 5, 6]
    assert (spool.dropped_samples, spool.dropped_other) == (2, 0)
    spool.append(loads_msg(2))           # 7 -> drops 5
    spool.append(loads_msg(3))           # 8 -> drops 6
    spool.append(loads_msg(4))           # 9 -> no samples left: drops the oldest loads (2)
    assert [s for s, _ in spool.pending()] == [4, 7, 8, 9]
    assert (spool.dropped_samples, spool.dropped_other) == (4, 1)
    spool.close()
    assert Spool(tmp_path).dropped_total == 5  # counters are persisted


def test_byte_bound(tmp_path):
    msg = sample_msg(1000.5)
    msg.seq = 1
    one = len(msg.SerializeToString())  # every message below has this size (seq < 128)
    spool = Spool(tmp_path, max_bytes=3 * one + 10)
    for i in range(10):
        spool.append(sample_msg(1000.5 + i))
    assert spool.count == 3 and spool.bytes <= 3 * one + 10 and spool.dropped_samples == 7


def test_advance_past_renumbers_when_the_control_plane_is_ahead(tmp_path):
    spool = Spool(tmp_path)
    spool.append(sample_msg(0))
    spool.append(loads_msg(7))
    assert spool.advance_past(1) == 0  # not ahead: nothing to do
    assert spool.advance_past(500) == 2
    pending = spool.pending()
    assert [s for s, _ in pending] == [501, 502]
    assert [pb.AgentMessage.FromString(p).seq for _, p in pending] == [501, 502]
    assert pb.AgentMessage.FromString(pending[1][1]).loads.step == 7
    assert spool.append(sample_msg(1)) == 503


def test_rejects_bad_bounds_and_empty_messages(tmp_path):
    with pytest.raises(ValueError, match="max_messages"):
        Spool(tmp_path, max_messages=0)
    with pytest.raises(ValueError, match="body"):
        Spool(tmp_path).append(pb.AgentMessage())
