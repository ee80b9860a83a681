"""A scripted agent stream that also reports how the stream ended (its gRPC status), with
optional token metadata, for the trust-boundary tests."""

from __future__ import annotations

import asyncio

import grpc

from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as rpc
from tests.controlplane.agentclient import ScriptedAgent


class Agent(ScriptedAgent):
    """``ScriptedAgent`` with a bearer ``token`` and ``ended``: set once the stream ended, with
    ``status`` the StatusCode it ended with."""

    def __init__(self, port: int, node_id: str = "node-0", token: str | None = None):
        super().__init__(port, node_id)
        self.token = token
        self.ended = asyncio.Event()
        self.status: grpc.StatusCode | None = None
        self.details = ""

    async def __aenter__(self):
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        self.call = rpc.IngestStub(self.channel).Connect(self._requests(), metadata=metadata)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self):
        try:
            await super()._read()
            self.status = await self.call.code()
        except grpc.aio.AioRpcError as exc:
            self.status, self.details = exc.code(), exc.details() or ""
        finally:
            self.ended.set()

    async def wait_ended(self, timeout: float = 10.0) -> grpc.StatusCode:
        await asyncio.wait_for(self.ended.wait(), timeout)
        return self.status

    async def config(self, timeout: float = 10.0) -> pb.Config:
        """The Config answering the hello (raises TimeoutError if the stream ended instead)."""
        done = asyncio.ensure_future(self.wait_for(
            lambda r: any(m.WhichOneof("body") == "config" for m in r), timeout))
        ended = asyncio.ensure_future(self.ended.wait())
        await asyncio.wait([done, ended], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not done.done():
            done.cancel()
            raise AssertionError(f"no config: stream ended with {self.status} {self.details!r}")
        return next(m.config for m in self.received if m.WhichOneof("body") == "config")
