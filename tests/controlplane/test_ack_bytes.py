"""The hand-built OK ack bytes are exactly what protobuf would serialize (and parse back)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from moeplane.controlplane.ingest.service import ok_ack
from moeplane.controlplane.wire import moeplane_pb2 as pb


@given(seq=st.integers(min_value=0, max_value=2**63 - 1), duplicate=st.booleans())
def test_ok_ack_matches_protobuf(seq: int, duplicate: bool):
    want = pb.ControlMessage(ack=pb.Ack(seq=seq, duplicate=duplicate))
    assert ok_ack(seq, duplicate) == want.SerializeToString()
    back = pb.ControlMessage.FromString(ok_ack(seq, duplicate))
    assert (back.ack.seq, back.ack.duplicate, back.ack.code) == (seq, duplicate, 0)
