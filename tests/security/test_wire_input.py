"""Odd bytes and numbers on the gRPC stream get INVALID_ARGUMENT naming what is wrong, never
an internal error (issue 33, items 10 and 13)."""

from __future__ import annotations

import grpc
import pytest

from moeplane.controlplane.wire import moeplane_pb2 as pb
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, samples
from tests.controlplane.serverthread import running_server

INVALID_ARGUMENT = 3


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with running_server(f"sqlite:///{tmp_path_factory.mktemp('wire') / 'w.sqlite'}") as info:
        yield info


def test_a_seq_past_int64_is_refused_naming_seq(srv):
    async def script():
        async with ScriptedAgent(srv["grpc_port"]) as agent:
            agent.send(hello())
            big = samples(1)
            big.seq = 2**63
            agent.send(big)
            agent.send(samples(2))  # the stream goes on
            return await agent.wait_acks([2**63, 2])

    acks = aio.run(script())
    assert acks[2**63].code == INVALID_ARGUMENT and acks[2**63].message.startswith("seq:")
    assert acks[2].code == 0


@pytest.mark.parametrize("garbage_first", [False, True], ids=["after-hello", "first"])
def test_garbage_bytes_end_the_stream_with_invalid_argument(srv, garbage_first):
    async def script():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv['grpc_port']}") as channel:
            connect = channel.stream_stream(
                "/moeplane.v1.Ingest/Connect",
                request_serializer=lambda raw: raw, response_deserializer=pb.ControlMessage.FromString,
            )
            frames = [] if garbage_first else [hello("node-7", first_rank=40).SerializeToString()]
            frames.append(b"\xff\xff\xff\xff\x0f")  # a truncated varint: not an AgentMessage
            call = connect(iter(frames))
            try:
                async for _msg in call:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details()
            return await call.code(), await call.details()

    code, details = aio.run(script())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "not an AgentMessage" in details
