"""Memory messages of a node → validated records (the per-device checks: :mod:`.codec`).

Pure: raises WireError naming the bad field.
"""

from __future__ import annotations

from moeplane.controlplane.memory.codec import (
    check_bytes,
    decision_message,
    engine_check,
    profile_record,
    report_fields,
)
from moeplane.controlplane.memory.records import NodeMemoryRecord, ProfileRecord
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import WireError
from moeplane.controlplane.wire.checks import check_id, check_time

__all__ = ["decision_message", "profile_records", "report_fields"]


def profile_records(
    msg: pb.MemoryProfiles, *, node_id: str, job_id: str, known_devices: set[str]
) -> tuple[NodeMemoryRecord, list[ProfileRecord]]:
    """Validate a node's MemoryProfiles. ``job_id``: the job of the stream's node."""
    if msg.job_id != job_id:
        raise WireError("memory.job_id", f"{msg.job_id!r} is not the job of node {node_id!r} ({job_id!r})")
    if msg.step < 0:
        raise WireError("memory.step", f"must be >= 0, got {msg.step}")
    ts = check_time(msg.timestamp, "memory.timestamp")
    host_free = check_bytes(msg.host_free_bytes, "memory.host_free_bytes")
    if not msg.devices:
        raise WireError("memory.devices", "must not be empty")
    node = NodeMemoryRecord(job_id, node_id, int(msg.step), ts, host_free)
    profiles: list[ProfileRecord] = []
    for i, dev in enumerate(msg.devices):
        field = f"memory.devices[{i}]"
        check_id(dev.device_id, f"{field}.device_id")
        if dev.device_id not in known_devices:
            raise WireError(f"{field}.device_id", f"unknown device {dev.device_id!r} of node {node_id!r}")
        if any(p.device_id == dev.device_id for p in profiles):
            raise WireError(f"{field}.device_id", f"duplicate device {dev.device_id!r}")
        rec = profile_record(dev, field, job_id=job_id, node_id=node_id, step=int(msg.step), ts=ts)
        engine_check(rec, host_free, field)
        profiles.append(rec)
    return node, profiles
