"""Protobuf messages → validated store records. Pure: raises WireError naming the bad field.

Checks what a sender can get wrong: dtypes, shapes against the job, byte lengths, negative
counts, NaN, unknown devices of the node, empty ids. Ingest turns a WireError into an Ack with
INVALID_ARGUMENT; the stream and the rest of the batch go on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.balancing.groups import check_groups
from moeplane.controlplane.store.placements import slots_per_rank
from moeplane.controlplane.store.records import (
    DeviceRecord,
    HelloRecord,
    JobRecord,
    LoadsRecord,
    RankStatsRow,
    SamplesRecord,
    StepStatsRecord,
)
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError, decode_array
from moeplane.controlplane.wire.checks import CONTROL_CHARS, MAX_ID, check_id, check_time

MAX_DEVICES = 4096
MAX_METRICS = 256
MAX_DIM = 65536


@dataclass(frozen=True)
class JobShape:
    """What ingest needs to know of a job to check its loads: L layers × E experts."""

    layers: int | None
    experts: int | None


def hello_record(msg: pb.Hello, ts: float) -> HelloRecord:
    node_id = check_id(msg.node_id, "hello.node_id")
    if len(msg.devices) > MAX_DEVICES:
        raise WireError("hello.devices", f"more than {MAX_DEVICES} devices")
    devices = []
    seen = set()
    for i, d in enumerate(msg.devices):
        did = check_id(d.device_id, f"hello.devices[{i}].device_id")
        if did in seen:
            raise WireError(f"hello.devices[{i}].device_id", f"duplicate {did!r}")
        seen.add(did)
        if d.memory_total_bytes < 0:
            raise WireError(f"hello.devices[{i}].memory_total_bytes", "must not be negative")
        devices.append(
            DeviceRecord(did, d.index, d.kind or "unknown", d.model, d.memory_total_bytes, d.rank)
        )
    job_id = check_id(msg.job_id, "hello.job_id", allow_empty=True)
    job = None
    if msg.HasField("job") and msg.job.job_id:
        j = msg.job
        if j.job_id != job_id:
            raise WireError("hello.job.job_id", f"{j.job_id!r} differs from hello.job_id {job_id!r}")
        for name in ("layers", "experts", "top_k", "world_size", "slots_per_rank", "ranks_per_node",
                     "groups"):
            v = getattr(j, name)
            if v < 0 or v > MAX_DIM:
                raise WireError(f"hello.job.{name}", f"must be in 0..{MAX_DIM}, got {v}")
        if j.groups:
            _check_groups(j)
        job = JobRecord(
            job_id, j.layers or None, j.experts or None, j.top_k or None, j.world_size or None,
            j.slots_per_rank or None, j.ranks_per_node or None, j.groups or None,
        )
    if any(r < 0 for r in msg.ranks):
        raise WireError("hello.ranks", "ranks must not be negative")
    return HelloRecord(
        node_id=node_id,
        hostname=msg.hostname[:255],
        agent_version=msg.agent_version[:64],
        job_id=job_id,
        ranks=tuple(msg.ranks),
        devices=tuple(devices),
        job=job,
        ts=ts,
    )


def _check_groups(j: pb.JobSpec) -> None:
    """``job.groups`` = K needs the job's shape to keep each group on one node, as EPLB's
    hierarchical policy does: K divides E, the nodes (``world_size / ranks_per_node``) divide
    K, and a node's slots (``ranks_per_node x S``, S as the job's geometry takes it) hold its
    ``E / N`` experts. WireError naming ``hello.job.groups`` otherwise."""
    missing = [n for n in ("experts", "world_size", "ranks_per_node") if not getattr(j, n)]
    if missing:
        raise WireError("hello.job.groups", f"groups = {j.groups} needs hello.job."
                        f"{', hello.job.'.join(missing)} (the nodes each group is kept on)")
    if j.world_size % j.ranks_per_node:
        raise WireError("hello.job.groups", f"groups = {j.groups}: ranks_per_node = "
                        f"{j.ranks_per_node} does not divide world_size = {j.world_size}")
    slots = slots_per_rank(j.experts, j.world_size, j.slots_per_rank)  # as the job's geometry
    try:
        check_groups(j.groups, j.experts, j.world_size, slots, j.world_size // j.ranks_per_node)
    except ValueError as exc:
        raise WireError("hello.job.groups", str(exc)) from None


Layout = tuple[tuple[str, ...], tuple[str, ...]]  # (device_ids, metrics) of a frame


class CheckedLayouts:
    """The (device_ids, metrics) layouts one stream sent that passed their checks (at most
    ``limit`` kept), the last of them also as lists.

    An agent sends the same layout every round: comparing the message's repeated fields with
    the last layout's lists (~1 us) skips building two tuples of new strings, hashing and
    comparing them (~2.4 us); and the frames of a stream then share one pair of tuples, which
    the store's layout-id lookup compares by identity instead of string by string.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        self.layouts: dict[Layout, Layout] = {}
        self.last: tuple[list[str], list[str], Layout] | None = None


def samples_record(msg: pb.DeviceSamples, *, node_id: str, seq: int, known_devices: set[str],
                   checked_layouts: CheckedLayouts | None = None) -> SamplesRecord:
    """A validated frame. ``values`` stays the wire's float32 or float64 [D, M] (a read-only
    view of the message bytes, no copy).

    ``checked_layouts``: the layouts this stream already sent and passed (the same every
    round); the device and name checks are skipped for them and a passing layout is added.
    The caller must start a new one when ``known_devices`` shrinks (it only grows).
    """
    ts = check_time(msg.timestamp, "samples.timestamp")
    last = None if checked_layouts is None else checked_layouts.last
    if last is not None and msg.device_ids == last[0] and msg.metrics == last[1]:
        device_ids, metrics = last[2]
    else:
        device_ids, metrics = tuple(msg.device_ids), tuple(msg.metrics)
        layout = (device_ids, metrics)
        known = None if checked_layouts is None else checked_layouts.layouts.get(layout)
        if known is None:
            _check_layout(device_ids, metrics, node_id, known_devices)
            if checked_layouts is not None and len(checked_layouts.layouts) < checked_layouts.limit:
                known = checked_layouts.layouts[layout] = layout
        if known is not None:
            device_ids, metrics = known
            checked_layouts.last = (list(device_ids), list(metrics), known)
    values = decode_array(msg.values, "samples.values", ndim=2, shape=(len(device_ids), len(metrics)),
                          kinds="f", finite=False)
    if np.isinf(values).any():
        raise WireError("samples.values", "contains infinity (use NaN for 'not measured')")
    return SamplesRecord(node_id, seq, ts, device_ids, metrics, values)


def _check_layout(device_ids: tuple[str, ...], metrics: tuple[str, ...], node_id: str,
                  known_devices: set[str]) -> None:
    d, m = len(device_ids), len(metrics)
    if d == 0:
        raise WireError("samples.device_ids", "must not be empty")
    if m == 0 or m > MAX_METRICS:
        raise WireError("samples.metrics", f"must hold 1..{MAX_METRICS} names, got {m}")
    if not known_devices.issuperset(device_ids):
        for i, did in enumerate(device_ids):
            if did not in known_devices:
                raise WireError(f"samples.device_ids[{i}]", f"{did!r} is not a device of node {node_id!r} (declare it in hello)")
    if len(set(metrics)) != m:
        raise WireError("samples.metrics", "names must be unique")
    if "" in metrics or max(map(len, metrics)) > MAX_ID or CONTROL_CHARS.search("".join(metrics)):
        for i, name in enumerate(metrics):
            check_id(name, f"samples.metrics[{i}]")


def loads_record(msg: pb.ExpertLoads, *, node_id: str, seq: int, job: JobShape | None) -> LoadsRecord:
    job_id = check_id(msg.job_id, "loads.job_id")
    if job is None:
        raise WireError("loads.job_id", f"unknown job {job_id!r}")
    if msg.step < 0:
        raise WireError("loads.step", f"must not be negative, got {msg.step}")
    ts = check_time(msg.timestamp, "loads.timestamp")
    counts = decode_array(
        msg.counts, "loads.counts", ndim=2, shape=(job.layers, job.experts), kinds="i", nonnegative=True
    )
    if counts.shape[0] == 0 or counts.shape[1] == 0:
        raise WireError("loads.counts.shape", f"must be non-empty [L, E], got {counts.shape}")
    if any(r < 0 for r in msg.ranks) or any(r < 0 for r in msg.missing_ranks):
        raise WireError("loads.ranks", "ranks must not be negative")
    if len(set(msg.ranks)) != len(msg.ranks) or len(msg.ranks) > 256:
        raise WireError("loads.ranks", "ranks must be unique, at most 256")
    return LoadsRecord(
        node_id, seq, job_id, int(msg.step), ts, tuple(sorted(msg.ranks)), tuple(sorted(msg.missing_ranks)),
        counts,  # read-only view of the wire bytes (int32 or int64); summed into int64 by the store
    )


def step_stats_record(msg: pb.StepStats, *, node_id: str, seq: int, job_known: bool) -> StepStatsRecord:
    job_id = check_id(msg.job_id, "step_stats.job_id")
    if not job_known:
        raise WireError("step_stats.job_id", f"unknown job {job_id!r}")
    if msg.step < 0:
        raise WireError("step_stats.step", f"must not be negative, got {msg.step}")
    ts = check_time(msg.timestamp, "step_stats.timestamp")
    rows = []
    seen = set()
    for i, r in enumerate(msg.ranks):
        f = f"step_stats.ranks[{i}]"
        if r.rank < 0 or r.rank in seen:
            raise WireError(f"{f}.rank", f"negative or repeated rank {r.rank}")
        seen.add(r.rank)
        if not (math.isfinite(r.step_time_s) and r.step_time_s >= 0):
            raise WireError(f"{f}.step_time_s", f"must be finite and >= 0, got {r.step_time_s}")
        if not (math.isfinite(r.host_bound_ratio) and 0 <= r.host_bound_ratio <= 1):
            raise WireError(f"{f}.host_bound_ratio", f"must be in [0, 1], got {r.host_bound_ratio}")
        if r.tokens < 0:
            raise WireError(f"{f}.tokens", f"must not be negative, got {r.tokens}")
        rows.append(RankStatsRow(r.rank, r.step_time_s, r.host_bound_ratio, r.tokens))
    return StepStatsRecord(node_id, seq, job_id, int(msg.step), ts, tuple(rows))
