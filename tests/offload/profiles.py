"""Memory profiles and reports for offload tests, as the wire carries them (bytes, seconds),
and small helpers for talking to the scripted agents."""

from __future__ import annotations

from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.procs import wait_until as poll  # noqa: F401 - the offload tests import it from here

GIB = 1 << 30
G0, G1, H0 = "node-0/gpu0", "node-0/gpu1", "node-1/gpu0"
CAPACITY = 16 * GIB


def device_profile(device_id: str, rank: int = 0, *, used: int = 15 * GIB, layers: int = 4,
                   applied: tuple[str, ...] = ()) -> pb.MemoryProfile:
    """A 16 GiB device: per layer 0.5 GiB weights, 1 GiB Adam state, 1.5 GiB activations.

    Breakdown: parameters 2, gradients 2, optimizer 4, activations 6 GiB; ``used`` 15 GiB is
    over a 0.9 high watermark (14.4 GiB), 12 GiB is between 0.7 and 0.9.
    """
    return pb.MemoryProfile(
        device_id=device_id, rank=rank, capacity_bytes=CAPACITY, used_bytes=used,
        parameters_bytes=layers * GIB // 2, gradients_bytes=layers * GIB // 2,
        optimizer_bytes=layers * GIB, activations_peak_bytes=layers * 3 * GIB // 2,
        host_link_bytes_per_s=25e9, applied_actions=list(applied),
        layers=[
            pb.LayerMemory(name=f"layers.{i}", activation_bytes=3 * GIB // 2, forward_s=0.010,
                           backward_s=0.020, parameter_bytes=GIB // 2, optimizer_bytes=GIB)
            for i in range(layers)
        ],
    )


def memory(seq: int, devices: list[pb.MemoryProfile], *, step: int = 10, job_id: str = "job-1",
           host_free: int = 64 * GIB) -> pb.AgentMessage:
    return pb.AgentMessage(
        seq=seq,
        memory=pb.MemoryProfiles(job_id=job_id, step=step, timestamp=1000.0 + step,
                                 host_free_bytes=host_free, devices=devices),
    )


def report(seq: int, decision_id: int, device_id: str, state=pb.PLAN_STATE_APPLIED, *, step: int = 12,
           used: int = 14 * GIB, saved: int = GIB, error: str = "", job_id: str = "job-1") -> pb.AgentMessage:
    return pb.AgentMessage(
        seq=seq,
        offload_report=pb.OffloadReport(job_id=job_id, decision_id=decision_id, device_id=device_id,
                                        state=state, step=step, measured_used_bytes=used,
                                        measured_saved_bytes=saved, error=error),
    )


def offloads(agent) -> list[pb.OffloadDecision]:
    return [m.offload for m in agent.received if m.WhichOneof("body") == "offload"]


def send(agent, msg: pb.AgentMessage) -> pb.Ack:
    """Send ``msg`` and wait for its ack."""
    agent.send(msg)
    return aio.run(agent.wait_acks([msg.seq]))[msg.seq]
