"""The node-local endpoint: ``NodeLocal.Attach`` for training ranks, on a Unix socket.

A rank opens one stream, sends ``RankHello`` first, then ``RankStep`` per step (with its
``MemoryProfile`` when it measured one), ``PlanReport`` when it applies a plan and
``OffloadReport`` when it applies an offload decision. The agent writes
``RankControl(plan=...)`` / ``RankControl(offload=...)`` down the stream when a plan or an
offload decision arrives, and ``RankControl(ack=Ack(seq=step, code=3, ...))`` when it rejects
a step or part of one (the stream survives). A bad hello ends the stream with INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import grpc

from moeplane.agents.node import NodeState
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire import moeplane_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

INVALID_ARGUMENT = 3


def default_socket_path(node_id: str) -> str:
    return f"/tmp/moeplane-agent-{node_id}.sock"


class NodeLocalService(pb_grpc.NodeLocalServicer):
    def __init__(self, node: NodeState):
        self.node = node

    async def Attach(self, request_iterator, context):  # noqa: N802 - gRPC method name
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "first message must be a RankHello")
        try:
            link = self.node.attach(first.hello)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        writer = asyncio.create_task(self._write(context, link.outbox))
        try:
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    break
                body = msg.WhichOneof("body")
                try:
                    if body == "step":
                        self.node.rank_step(link, msg.step)
                    elif body == "plan_report":
                        self.node.rank_plan_report(link, msg.plan_report)
                    elif body == "offload_report":
                        self.node.rank_offload_report(link, msg.offload_report)
                    elif body == "rl":
                        self.node.rank_rl(link, msg.rl)
                    else:
                        raise ValueError(f"body: {body!r} not allowed after the hello")
                except ValueError as exc:
                    log.warning("rank %d: rejected %s: %s", link.rank, body, exc)
                    link.outbox.put_nowait(pb.RankControl(ack=pb.Ack(
                        seq=msg.step.step if body == "step" else 0,
                        code=INVALID_ARGUMENT, message=str(exc))))
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self.node.detach(link)

    @staticmethod
    async def _write(context, outbox: asyncio.Queue) -> None:
        while True:
            await context.write(await outbox.get())


async def start_local_server(node: NodeState, socket_path: str) -> grpc.aio.Server:
    """Serve NodeLocal on ``unix:socket_path`` (a stale socket file is replaced)."""
    path = Path(socket_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
    server = grpc.aio.server()
    pb_grpc.add_NodeLocalServicer_to_server(NodeLocalService(node), server)
    if server.add_insecure_port(f"unix:{path}") == 0:
        raise OSError(f"cannot listen on unix:{path}")
    await server.start()
    with contextlib.suppress(OSError):
        os.chmod(path, 0o660)
    return server
