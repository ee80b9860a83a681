"""Open an Ingest.Connect stream with optional token metadata and TLS; report how it went."""

from __future__ import annotations

import asyncio

import grpc

from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc
from tests.controlplane.agentclient import hello


async def first_reply(port: int, node_id: str, token: str | None = None, root_cert: bytes | None = None,
                      timeout: float = 10.0, first_rank: int = 0):
    """Send a hello for ``node_id`` (running ranks first_rank, first_rank + 1 of job-1); return
    ("ok", first ControlMessage) or ("error", StatusCode)."""
    target = f"localhost:{port}" if root_cert else f"127.0.0.1:{port}"
    if root_cert:
        channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=root_cert))
    else:
        channel = grpc.aio.insecure_channel(target)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    done = asyncio.Event()

    async def requests():
        yield hello(node_id, first_rank=first_rank)
        await done.wait()

    try:
        call = rpc.IngestStub(channel).Connect(requests(), metadata=metadata)
        try:
            msg = await asyncio.wait_for(call.read(), timeout)
            if msg is grpc.aio.EOF:
                return "error", await call.code()
            return "ok", msg
        except grpc.aio.AioRpcError as exc:
            return "error", exc.code()
        finally:
            done.set()
            call.cancel()
    finally:
        await channel.close()
