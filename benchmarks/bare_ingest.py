"""The bare transport: the same grpc.aio bidirectional stream and bytes as ``Ingest.Connect``,
with nothing behind it. Each ExpertLoads' counts are decoded with ``numpy.frombuffer`` and
summed into one running total per process; device samples likewise. Every message gets the
same small Ack the control plane sends (the loadgen's window needs it), a hello gets a Config.

    .venv/bin/python -m benchmarks.bare_ingest --port 50099
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
import numpy as np

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc


class BareIngest(rpc.IngestServicer):
    def __init__(self):
        self.total = 0
        self.samples = 0.0

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        async for msg in request_iterator:
            kind = msg.WhichOneof("body")
            if kind == "hello":
                yield pb.ControlMessage(config=pb.Config(sample_interval_s=1.0, job_id=msg.hello.job_id))
                continue
            if kind == "loads":
                c = msg.loads.counts
                self.total += int(np.frombuffer(c.data, dtype=np.dtype(c.dtype).newbyteorder("<")).sum())
            elif kind == "samples":
                v = msg.samples.values
                self.samples += float(np.frombuffer(v.data, dtype=np.dtype(v.dtype).newbyteorder("<")).sum())
            yield pb.ControlMessage(ack=pb.Ack(seq=msg.seq, code=0))


async def main(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    rpc.add_IngestServicer_to_server(BareIngest(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(f"bare ingest on 127.0.0.1:{port}", flush=True)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(main(ap.parse_args().port))
