"""Build ``RLReport`` messages from span columns (the SDK, the framework-log followers and the
simulator share it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array


def encode_spans(spans: Spans) -> pb.RLSpans:
    """Packed columns; phase and role codes index the full vocabulary (PHASES, ROLES)."""
    return pb.RLSpans(
        phase_names=PHASES, role_names=ROLES,
        step=encode_array(np.asarray(spans.step, dtype=np.int64)),
        rank=encode_array(np.asarray(spans.rank, dtype=np.int32)),
        version=encode_array(np.asarray(spans.version, dtype=np.int64)),
        phase=encode_array(np.asarray(spans.phase, dtype=np.uint8)),
        role=encode_array(np.asarray(spans.role, dtype=np.uint8)),
        start=encode_array(np.asarray(spans.start, dtype=np.float64)),
        end=encode_array(np.asarray(spans.end, dtype=np.float64)),
        tokens=encode_array(np.asarray(spans.tokens, dtype=np.int64)),
    )


def phase_loads(step: int, rank: int, phase: str, counts: np.ndarray, timestamp: float) -> pb.PhaseLoads:
    """One rank's expert loads in one phase of one step: ``counts`` int [L, E] tokens routed to
    each expert of each MoE layer during the phase (sent as int32 when it fits, else int64);
    ``timestamp`` unix seconds when the phase ended."""
    counts = np.asarray(counts)
    narrow = counts.size == 0 or (counts.min() >= 0 and counts.max() <= np.iinfo(np.int32).max)
    return pb.PhaseLoads(step=step, rank=rank, phase=phase, timestamp=timestamp,
                         counts=encode_array(counts.astype(np.int32 if narrow else np.int64)))


def rl_report(job_id: str, spans: Spans | None = None, syncs: Sequence[pb.WeightSync] = (),
              batches: Sequence[pb.ConsumedBatch] = (), loads: Sequence[pb.PhaseLoads] = ()) -> pb.RLReport:
    msg = pb.RLReport(job_id=job_id, syncs=list(syncs), batches=list(batches), phase_loads=list(loads))
    if spans is not None and len(spans):
        msg.spans.CopyFrom(encode_spans(spans))
    return msg
