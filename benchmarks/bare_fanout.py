"""The bare transport for plan fan-out: the same grpc.aio ``Ingest.Connect`` streams, the same
loadgen agents and the same plan bytes as ``moeplane serve``, with nothing behind the server.

No database, no plan lifecycle, no bus: a hello gets a Config, every message gets the same
small Ack the control plane sends (built by ``moeplane.controlplane.ingest.service.ok_ack``), and the
server pushes the plans itself. Once ``--agents`` streams are open it runs ``--rounds`` rounds
per row: take the push time, put ONE serialized ``ControlMessage(plan=...)`` (shared bytes,
passed through gRPC untouched like serve's) on every stream, wait until every agent reported
the epoch. The rows mirror ``benchmarks.fanout``: "incremental" alternates two placements A and
B as deltas (after A in full), "full" alternates R and the identity in full. Push times go to
``--out`` as JSON {"pushed": {"incremental": {epoch: unix s}, "full": {...}}, "cpu": {row: CPU s
per round of this process}}; the loadgen records when each
agent rebuilt each plan. ``benchmarks.fanout --bare`` drives it.

    .venv/bin/python -m benchmarks.bare_fanout --port P --agents N --rounds R --placements F.npz --out F.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import grpc
import numpy as np

from moeplane.controlplane.ingest.planpush import control_with_plan
from moeplane.controlplane.ingest.service import ok_ack
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.plan_codec import delta_plan, full_plan


class BareFanout:
    """Streams by node; per epoch, how many agents reported it."""

    def __init__(self, job_id: str, slots: int):
        self.job_id, self.slots = job_id, slots
        self.streams: dict[str, asyncio.Queue] = {}
        self.reported: Counter[int] = Counter()
        self.changed = asyncio.Event()  # set on each new stream and each plan report

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        out: asyncio.Queue = asyncio.Queue()
        node = ""

        async def read() -> None:
            nonlocal node
            async for msg in request_iterator:
                kind = msg.WhichOneof("body")
                if kind == "hello":
                    node = msg.hello.node_id
                    out.put_nowait(pb.ControlMessage(config=pb.Config(
                        sample_interval_s=1.0, job_id=msg.hello.job_id)).SerializeToString())
                    self.streams[node] = out
                    self.changed.set()
                    continue
                if kind == "plan_report":
                    self.reported[msg.plan_report.epoch] += 1
                    self.changed.set()
                out.put_nowait(ok_ack(msg.seq, False))
            out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            if self.streams.get(node) is out:
                del self.streams[node]

    async def until(self, predicate) -> None:
        while not predicate():
            self.changed.clear()
            await self.changed.wait()

    async def push(self, message: bytes, epoch: int) -> float:
        """Put ``message`` (the plan of ``epoch``) on every stream; its push time, once every
        agent reported it."""
        t = time.time()
        for out in list(self.streams.values()):
            out.put_nowait(message)
        await self.until(lambda: self.reported[epoch] >= len(self.streams))
        return t

    def plans(self, placements: list[np.ndarray], first_epoch: int, rounds: int, delta: bool):
        """(epoch, ControlMessage bytes) of ``rounds`` plans cycling through ``placements``
        after the first (sent in full): deltas against the plan before when ``delta``."""
        prev = None
        for i in range(rounds + 1):
            epoch = first_epoch + i
            p = placements[i % len(placements)]
            plan = full_plan(self.job_id, epoch, p, self.slots, 0)
            if delta and prev is not None:
                plan = delta_plan(plan, p, epoch - 1, prev)
            prev = p
            yield epoch, control_with_plan(plan.SerializeToString())


async def main(a) -> None:
    z = np.load(a.placements)
    svc = BareFanout(a.job, int(z["slots"]))
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
    handler = grpc.stream_stream_rpc_method_handler(
        svc.Connect, request_deserializer=pb.AgentMessage.FromString, response_serializer=None)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("moeplane.v1.Ingest", {"Connect": handler}),))
    server.add_insecure_port(f"127.0.0.1:{a.port}")
    await server.start()
    print(f"bare fanout on 127.0.0.1:{a.port}", flush=True)
    await svc.until(lambda: len(svc.streams) >= a.agents)
    pushed: dict[str, dict[int, float]] = {"incremental": {}, "full": {}}
    cpu: dict[str, float] = {}  # row -> this process's CPU seconds per round
    epoch = 1
    for row, placements, delta in (("incremental", [z["a"], z["b"]], True),
                                   ("full", [z["r"], z["ident"]], False)):
        for i, (e, message) in enumerate(svc.plans(placements, epoch, a.rounds, delta)):
            if i == 1:
                cpu0 = time.process_time()
            t = await svc.push(message, e)
            if i:  # the first plan of a row only sets the base
                pushed[row][e] = t
            if a.settle_s:
                await asyncio.sleep(a.settle_s)
            epoch = e + 1
        cpu[row] = (time.process_time() - cpu0) / a.rounds
    with open(a.out, "w") as f:
        json.dump({"pushed": pushed, "cpu": cpu}, f)
    print("done", flush=True)
    await server.stop(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--agents", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--job", default="fanout")
    ap.add_argument("--placements", required=True, help=".npz with a, b, r, ident [L, G*S] and slots")
    ap.add_argument("--settle-s", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    asyncio.run(main(ap.parse_args()))
