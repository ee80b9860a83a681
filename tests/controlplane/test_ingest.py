"""Ingest over a real gRPC socket into a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import numpy as np
import pytest

from moeplane.controlplane.store import queries as q
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello, loads, samples
from tests.controlplane.serverthread import running_server

INVALID_ARGUMENT = 3


def test_hello_samples_loads_are_stored_and_acked(database_url):
    rng = np.random.default_rng(0)
    counts = [rng.integers(0, 100, size=(4, 8)) for _ in range(2)]
    with running_server(database_url) as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                await agent.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r))
                agent.send(samples(1))
                agent.send(loads(2, step=7, counts=counts[0]))
                acks = await agent.wait_acks([1, 2])
                assert acks[1].code == 0 and not acks[1].duplicate
                assert acks[2].code == 0 and not acks[2].duplicate
            # a second node contributes to the same step: the global matrix is the sum
            async with ScriptedAgent(srv["grpc_port"], "node-1") as agent:
                agent.send(hello("node-1", first_rank=2))
                agent.send(loads(1, step=7, counts=counts[1], ranks=(2, 3)))
                assert (await agent.wait_acks([1]))[1].code == 0

        aio.run(script())
        engine = srv["engine"]
        latest = q.latest_loads(engine, "job-1")
        assert latest["step"] == 7 and latest["nodes_reported"] == 2
        np.testing.assert_array_equal(latest["counts"], counts[0] + counts[1])
        values = q.latest_device_values(engine, "job-1")
        assert values["node-0/gpu1"]["metrics"]["memory_used_bytes"] == 2e9
        assert q.sample_count(engine) == 6


def test_resend_after_reconnect_is_stored_once(database_url):
    counts = np.full((4, 8), 3, dtype=np.int64)
    with running_server(database_url) as srv:

        async def script():
            for _attempt in range(2):  # the second connection resends everything
                async with ScriptedAgent(srv["grpc_port"]) as agent:
                    agent.send(hello())
                    agent.send(samples(1))
                    agent.send(loads(2, step=1, counts=counts))
                    acks = await agent.wait_acks([1, 2])
                    assert all(acks[s].code == 0 for s in (1, 2))
                    config = next(m.config for m in agent.received if m.WhichOneof("body") == "config")
            return acks, config

        acks, config = aio.run(script())
        assert acks[1].duplicate and acks[2].duplicate
        assert config.resume_after_seq == 2
        engine = srv["engine"]
        assert q.sample_count(engine) == 6
        np.testing.assert_array_equal(q.latest_loads(engine, "job-1")["counts"], counts)


def test_loads_dedup_by_step_even_with_a_new_seq(tmp_path):
    counts = np.ones((4, 8), dtype=np.int64)
    with running_server(f"sqlite:///{tmp_path / 's.sqlite'}") as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                agent.send(loads(1, step=5, counts=counts))
                agent.send(loads(2, step=5, counts=counts))  # agent lost its spool and renumbered
                return await agent.wait_acks([1, 2])

        acks = aio.run(script())
        assert not acks[1].duplicate and acks[2].duplicate
        np.testing.assert_array_equal(q.latest_loads(srv["engine"], "job-1")["counts"], counts)


BAD_CASES = [
    ("wrong shape", lambda: loads(1, 1, np.ones((3, 8), dtype=np.int64)), "loads.counts.shape"),
    ("float counts", lambda: loads(1, 1, np.ones((4, 8), dtype=np.float32)), "loads.counts.dtype"),
    ("negative", lambda: loads(1, 1, -np.ones((4, 8), dtype=np.int64)), "negative"),
    ("unknown job", lambda: loads(1, 1, np.ones((4, 8), dtype=np.int64), job_id="nope"), "unknown job"),
    (
        "byte length",
        lambda: pb.AgentMessage(
            seq=1,
            loads=pb.ExpertLoads(
                job_id="job-1", step=1, timestamp=1.0,
                counts=pb.NDArray(dtype="int64", shape=[4, 8], data=b"\0" * 17),
            ),
        ),
        "loads.counts.data",
    ),
    ("nan sample", lambda: samples(1, values=[[np.inf, 1, 1], [1, 1, 1]]), "samples.values"),
    ("foreign device", lambda: samples(1, node_id="node-9"), "samples.device_ids[0]"),
    (
        "oversize",
        lambda: pb.AgentMessage(
            seq=1,
            loads=pb.ExpertLoads(job_id="job-1", step=1, timestamp=1.0,
                                 counts=pb.NDArray(dtype="int64", shape=[1 << 13, 1 << 12], data=b"")),
        ),
        "exceeds the limit",
    ),
    ("no seq", lambda: samples(0), "seq"),
]


@pytest.mark.parametrize("name,make,needle", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_message_is_rejected_and_stream_survives(tmp_path, name, make, needle):
    good = np.full((4, 8), 2, dtype=np.int64)
    with running_server(f"sqlite:///{tmp_path / 'b.sqlite'}") as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                agent.send(loads(10, step=0, counts=good))  # accepted before the bad one
                bad = make()
                agent.send(bad)
                agent.send(loads(11, step=1, counts=good))  # and after it
                return await agent.wait_acks([bad.seq, 10, 11])

        acks = aio.run(script())
        bad_seq = make().seq
        assert acks[bad_seq].code == INVALID_ARGUMENT
        assert needle in acks[bad_seq].message
        assert acks[10].code == 0 and acks[11].code == 0
        assert q.count_rows(srv["engine"], "expert_loads", job_id="job-1") == 2


def test_first_message_must_be_hello(tmp_path):
    import grpc

    with running_server(f"sqlite:///{tmp_path / 'h.sqlite'}") as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(samples(1))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await agent._reader
                return info.value.code()

        assert aio.run(script()) == grpc.StatusCode.FAILED_PRECONDITION


def test_plan_published_on_bus_reaches_the_job_agent(tmp_path):
    with running_server(f"sqlite:///{tmp_path / 'p.sqlite'}") as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                await agent.wait_for(lambda r: any(m.WhichOneof("body") == "config" for m in r))
                plan = pb.PlacementPlan(
                    job_id="job-1", epoch=1, slots_per_rank=4,
                    phy2log=encode_array(np.arange(8, dtype=np.int64)[None].repeat(4, 0)),
                )
                await srv["bus"].publish("plans.job-1", plan.SerializeToString())
                msgs = await agent.wait_for(lambda r: any(m.WhichOneof("body") == "plan" for m in r))
                return next(m.plan for m in msgs if m.WhichOneof("body") == "plan")

        got = aio.run(script())
        assert got.epoch == 1 and list(got.phy2log.shape) == [4, 8]


def test_frames_after_a_checked_layout_are_still_checked(tmp_path):
    """The stream remembers the layout of its last good frame (and skips re-checking it); a
    later frame with another layout, or a bad array under the same layout, is still rejected
    with the field named, and the good frames around it are stored."""
    good_values = [[0.5, 1e9, 60.0], [0.6, 2e9, 61.0]]
    foreign = samples(3)
    foreign.samples.device_ids[1] = "node-9/gpu1"
    renamed = samples(4)
    renamed.samples.metrics[2] = "temp\x01"
    bad = {
        2: samples(2, values=[[np.inf, 1, 1], [1, 1, 1]]),  # same layout, infinite value
        3: foreign,
        4: renamed,
        5: samples(5, values=[[1, 1, 1], [1, 1, 1], [1, 1, 1]]),  # 3 rows for 2 devices
    }
    with running_server(f"sqlite:///{tmp_path / 'l.sqlite'}") as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                agent.send(samples(1, values=good_values))
                for msg in bad.values():
                    agent.send(msg)
                agent.send(samples(6, ts=1001.0, values=good_values))
                return await agent.wait_acks([1, 2, 3, 4, 5, 6])

        acks = aio.run(script())
        assert acks[1].code == 0 and acks[6].code == 0
        assert [acks[s].code for s in bad] == [INVALID_ARGUMENT] * len(bad)
        assert "infinity" in acks[2].message and "samples.values" in acks[2].message
        assert "samples.device_ids[1]" in acks[3].message
        assert "samples.metrics[2]" in acks[4].message
        assert "samples.values.shape" in acks[5].message
        assert q.count_rows(srv["engine"], "sample_frames") == 2


def test_frames_of_one_layout_share_its_tuples():
    from moeplane.controlplane.ingest import validate as v

    checked = v.CheckedLayouts()
    devices = {"node-0/gpu0", "node-0/gpu1"}
    a = v.samples_record(samples(1).samples, node_id="node-0", seq=1, known_devices=devices,
                         checked_layouts=checked)
    b = v.samples_record(samples(2).samples, node_id="node-0", seq=2, known_devices=devices,
                         checked_layouts=checked)
    assert a.device_ids is b.device_ids and a.metrics is b.metrics
    assert b.device_ids == ("node-0/gpu0", "node-0/gpu1") and b.values.shape == (2, 3)
    assert len(checked.layouts) == 1
