"""Builders of the wire messages the agent sends (``moeplane.v1``)."""

from __future__ import annotations

import numpy as np

from moeplane.agents.aggregation import NodeStep
from moeplane.agents.collectors.base import Device
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array


def device_info(device: Device, rank: int = -1) -> pb.DeviceInfo:
    return pb.DeviceInfo(
        device_id=device.device_id, index=device.index, kind=device.kind, model=device.model,
        memory_total_bytes=int(device.memory_total_bytes), rank=rank,
    )


def samples(timestamp: float, device_ids: list[str], metrics: list[str],
            values: np.ndarray) -> pb.AgentMessage:
    """values: [D, M] float; columns that are NaN on every device are left out."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(device_ids), len(metrics)):
        raise ValueError(f"values shape {values.shape} != ({len(device_ids)}, {len(metrics)})")
    keep = ~np.isnan(values).all(axis=0)
    return pb.AgentMessage(samples=pb.DeviceSamples(
        timestamp=timestamp,
        device_ids=device_ids,
        metrics=[name for name, k in zip(metrics, keep, strict=True) if k],
        values=encode_array(np.ascontiguousarray(values[:, keep])),
    ))


def loads(node_step: NodeStep) -> pb.AgentMessage:
    return pb.AgentMessage(loads=pb.ExpertLoads(
        job_id=node_step.job_id, step=node_step.step, ranks=list(node_step.ranks),
        missing_ranks=list(node_step.missing_ranks),
        counts=encode_array(node_step.counts.astype(np.int64, copy=False)),
        timestamp=node_step.timestamp,
    ))


def step_stats(node_step: NodeStep) -> pb.AgentMessage:
    return pb.AgentMessage(step_stats=pb.StepStats(
        job_id=node_step.job_id, step=node_step.step, timestamp=node_step.timestamp,
        ranks=[
            pb.RankStepStats(rank=r.rank, step_time_s=r.step_time_s,
                             host_bound_ratio=r.host_bound_ratio, tokens=r.tokens)
            for r in node_step.reports
        ],
    ))


def plan_report(job_id: str, epoch: int, state: int, step: int = 0,
                error: str = "") -> pb.AgentMessage:
    return pb.AgentMessage(plan_report=pb.PlanReport(
        job_id=job_id, epoch=epoch, state=state, step=step, error=error,
    ))
