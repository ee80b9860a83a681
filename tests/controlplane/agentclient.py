"""A minimal scripted agent for ingest tests: real grpc.aio stream, messages under test control."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc
from moeplane.controlplane.wire.arrays import encode_array


class ScriptedAgent:
    """Open a stream, send messages, collect every ControlMessage received."""

    def __init__(self, port: int, node_id: str = "node-0"):
        self.port = port
        self.node_id = node_id
        self.received: list[pb.ControlMessage] = []
        self._out: asyncio.Queue = asyncio.Queue()
        self._changed = asyncio.Condition()

    async def __aenter__(self):
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.call = rpc.IngestStub(self.channel).Connect(self._requests())
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc):
        self._out.put_nowait(None)
        self.call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.channel.close()

    async def _requests(self):
        while True:
            msg = await self._out.get()
            if msg is None:
                return
            yield msg

    async def _read(self):
        async for msg in self.call:
            async with self._changed:
                self.received.append(msg)
                self._changed.notify_all()

    def send(self, msg: pb.AgentMessage) -> None:
        self._out.put_nowait(msg)

    async def wait_for(self, predicate, timeout: float = 10.0):
        async def _wait():
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self.received))

        await asyncio.wait_for(_wait(), timeout)
        return self.received

    def acks(self) -> dict[int, pb.Ack]:
        return {m.ack.seq: m.ack for m in self.received if m.WhichOneof("body") == "ack"}

    async def wait_acks(self, seqs, timeout: float = 10.0) -> dict[int, pb.Ack]:
        want = set(seqs)
        await self.wait_for(lambda _r: want <= set(self.acks()), timeout)
        return self.acks()


def hello(node_id: str = "node-0", job_id: str = "job-1", devices: int = 2, layers=4, experts=8,
          first_rank: int = 0) -> pb.AgentMessage:
    """A hello of ``node_id`` with ``devices`` devices running ranks first_rank, first_rank + 1, ..."""
    return pb.AgentMessage(
        seq=0,
        hello=pb.Hello(
            node_id=node_id,
            hostname=f"host-{node_id}",
            agent_version="test",
            devices=[
                pb.DeviceInfo(device_id=f"{node_id}/gpu{i}", index=i, kind="sim", model="SimGPU",
                              memory_total_bytes=80 << 30, rank=first_rank + i)
                for i in range(devices)
            ],
            job_id=job_id,
            ranks=list(range(first_rank, first_rank + devices)),
            job=pb.JobSpec(job_id=job_id, layers=layers, experts=experts, top_k=2) if layers else None,
        ),
    )


def samples(seq: int, node_id: str = "node-0", devices: int = 2, ts: float = 1000.0, values=None) -> pb.AgentMessage:
    metrics = ["utilization_ratio", "memory_used_bytes", "temperature_celsius"]
    if values is None:
        values = np.array([[0.5 + 0.1 * d, 1e9 * (d + 1), 60.0 + d] for d in range(devices)])
    return pb.AgentMessage(
        seq=seq,
        samples=pb.DeviceSamples(
            timestamp=ts,
            device_ids=[f"{node_id}/gpu{d}" for d in range(devices)],
            metrics=metrics,
            values=encode_array(np.asarray(values, dtype=np.float64)),
        ),
    )


def loads(seq: int, step: int, counts: np.ndarray, job_id: str = "job-1", ts: float = 1000.0,
          ranks=(0, 1)) -> pb.AgentMessage:
    return pb.AgentMessage(
        seq=seq,
        loads=pb.ExpertLoads(job_id=job_id, step=step, ranks=list(ranks), counts=encode_array(counts), timestamp=ts),
    )
