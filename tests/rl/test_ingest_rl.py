"""RL reports over real gRPC into a real store (SQLite and PostgreSQL), read back over REST."""

from __future__ import annotations

import json

import httpx
import numpy as np

from moeplane.agents.rlreport import rl_report
from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello
from tests.controlplane.serverthread import running_server

INVALID_ARGUMENT = 3


def _steps(steps=(0, 1), ranks=(0, 1), t0=1000.0) -> Spans:
    """Per step and rank: generate (rank r ends r seconds later), weight_sync, train_update."""
    rows = []
    for s in steps:
        base = t0 + 100 * s
        for r in ranks:
            rows += [(s, r, s, "generate", "hybrid", base, base + 10 + 5 * r, 1000 + r),
                     (s, r, s, "weight_sync", "hybrid", base + 20, base + 22, 0),
                     (s, r, s, "train_update", "hybrid", base + 22, base + 40, 0)]
    return Spans.build(*zip(*rows, strict=True))


def _msg(seq: int, report: pb.RLReport) -> pb.AgentMessage:
    return pb.AgentMessage(seq=seq, rl=report)


def test_spans_syncs_batches_stored_once_and_read_back(database_url):
    spans = _steps()
    sync = pb.WeightSync(step=1, rank=0, from_version=0, to_version=1, bytes=4 << 30, start=1120.0,
                         pause_s=0.5, transfer_s=2.0, resume_s=0.25)
    batch = pb.ConsumedBatch(step=1, rank=-1, trained_version=1, samples=512, lag_min=0, lag_mean=0.5,
                             lag_max=1, bound=1, dropped=3, partial=7, timestamp=1140.0)
    report = rl_report("job-1", spans, [sync], [batch])
    with running_server(database_url) as srv:

        async def script():
            for attempt in range(2):  # the second stream resends: acks say duplicate
                async with ScriptedAgent(srv["grpc_port"]) as agent:
                    agent.send(hello())
                    agent.send(_msg(1, report))
                    acks = await agent.wait_acks([1])
                    assert acks[1].code == 0, acks[1].message
                    assert acks[1].duplicate == (attempt == 1)
            async with ScriptedAgent(srv["grpc_port"]) as agent:  # renumbered after a lost spool
                agent.send(hello())
                agent.send(_msg(2, report))
                assert (await agent.wait_acks([2]))[2].code == 0

        aio.run(script())
        with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/job-1/rl",
                          timeout=10) as api:
            got = api.get("/spans", params={"step_start": 0, "step_end": 2}).json()
            assert got["count"] == len(spans) == 12
            order = np.lexsort((spans.phase, spans.start, spans.rank, spans.step))
            assert got["start"] == spans.start[order].tolist()
            assert got["phase"] == [PHASES[p] for p in spans.phase[order]]
            assert got["tokens"] == spans.tokens[order].tolist() and set(got["node"]) == {"node-0"}
            assert set(got["role"]) == {"hybrid"}
            assert api.get("/spans", params={"step_start": 1, "step_end": 2}).json()["count"] == 6
            syncs = api.get("/syncs").json()
            assert len(syncs) == 1 and syncs[0]["gb_per_s"] == (4 << 30) / 2.0 / 1e9
            batches = api.get("/batches").json()
            assert [(b["dropped"], b["partial"], b["lag_max"]) for b in batches] == [(3, 7, 1)]
            # the idle analysis: rank 0 waits 5 s for rank 1's generation tail each step
            idle = api.get("/idle").json()
            assert idle["steps"] == [0, 1] and idle["ranks"] == [0, 1]
            tail = idle["causes"].index("generation_tail")
            assert [row[tail] for row in idle["idle_by_cause_s"]] == [5.0, 5.0]
            assert idle["summary"]["bottleneck"] == "trainer"
            # Chrome trace: valid JSON whose complete events are exactly the stored spans
            trace = json.loads(api.get("/trace", params={"step_start": 0, "step_end": 2}).text)
            events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
            assert sorted((e["args"]["rank"], e["ts"], e["name"]) for e in events) == sorted(
                (int(r), s * 1e6, PHASES[p]) for r, s, p in zip(spans.rank, spans.start, spans.phase, strict=True))
            assert all(e["dur"] >= 0 and e["pid"] == 1 and e["tid"] == e["args"]["rank"] for e in events)
            names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
            assert names == {"node-0"}
            # /metrics: per job, over the complete steps (step 1, the newest, may still be arriving)
            text = httpx.get(f"http://127.0.0.1:{srv['http_port']}/metrics").text
            assert 'moeplane_rl_idle_seconds{cause="generation_tail",job_id="job-1"} 5.0' in text
            assert 'moeplane_rl_black_hole_fraction{job_id="job-1"}' in text
            assert 'moeplane_rl_black_hole_alert{job_id="job-1"} 0.0' in text
            # bad ranges and unknown jobs are 4xx
            assert api.get("/spans", params={"step_start": 5, "step_end": 5}).status_code == 422
            assert api.get("/spans", params={"step_start": -1}).status_code == 422
            assert api.get("/idle", params={"step_start": 0, "step_end": 10**6}).status_code == 422
            assert httpx.get(f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/nope/rl/spans").status_code == 404


def test_bad_rows_are_refused_by_name_and_the_rest_stored(tmp_path):
    good = _steps(steps=(0,), ranks=(0,))
    with running_server(f"sqlite:///{tmp_path / 's.sqlite'}") as srv:

        def with_bad(**changes) -> pb.RLReport:
            """The good spans plus one extra row (rank 1, step 1, v1) with ``changes``."""
            row = {"step": 1, "rank": 1, "version": 1, "phase": 0, "role": 0, "start": 2000.0, "end": 2001.0,
                   "tokens": 0} | changes
            msg = rl_report("job-1", good)
            for col, value in row.items():
                arr = np.append(getattr(good, col), value).astype(getattr(good, col).dtype)
                if col in ("phase", "role"):
                    arr = arr.astype(np.uint8)
                getattr(msg.spans, col).CopyFrom(encode_array(arr))
            return msg

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())
                agent.send(_msg(1, rl_report("job-1", _steps(steps=(5,), ranks=(1,)))))  # rank 1 at v5
                assert (await agent.wait_acks([1]))[1].code == 0
                unknown_phase = with_bad(phase=len(PHASES))
                unknown_phase.spans.phase_names.append("dream")
                unknown_role = with_bad(role=len(ROLES))
                unknown_role.spans.role_names.append("critic")
                cases = {
                    2: (with_bad(start=3000.0, end=2999.0), "rl.spans.end[3]"),
                    3: (unknown_phase, "rl.spans.phase[3]"),
                    4: (unknown_role, "rl.spans.role[3]"),
                    5: (with_bad(version=4, start=9000.0, end=9001.0), "rl.spans.version[3]"),
                    6: (with_bad(rank=7), "rl.spans.rank[3]"),
                    7: (rl_report("job-2", good), "rl.job_id"),
                    8: (with_bad(step=-1), "rl.spans.step[3]"),
                }
                for seq, (msg, _field) in cases.items():
                    agent.send(_msg(seq, msg))
                acks = await agent.wait_acks(cases)
                for seq in cases:
                    field = cases[seq][1]
                    assert acks[seq].code == INVALID_ARGUMENT, (seq, acks[seq].message)
                    assert acks[seq].message.startswith(field), (seq, acks[seq].message)
                assert "'dream'" in acks[3].message and "goes backwards" in acks[5].message
                assert "1 of 4 items refused" in acks[2].message
                bad_sync = rl_report("job-1", syncs=[pb.WeightSync(from_version=3, to_version=2)])
                agent.send(_msg(9, bad_sync))
                assert (await agent.wait_acks([9]))[9].message.startswith("rl.syncs[0].to_version")
                bad_batch = rl_report("job-1", batches=[pb.ConsumedBatch(lag_min=2, lag_mean=1.0, lag_max=3)])
                agent.send(_msg(10, bad_batch))
                assert (await agent.wait_acks([10]))[10].message.startswith("rl.batches[0].lag_mean")
                broken = rl_report("job-1", good)
                broken.spans.end.CopyFrom(encode_array(np.zeros(2)))
                agent.send(_msg(11, broken))
                assert (await agent.wait_acks([11]))[11].message.startswith("rl.spans.end.shape")

        aio.run(script())
        with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/job-1/rl",
                          timeout=10) as api:
            got = api.get("/spans", params={"step_start": 0, "step_end": 6}).json()
        # rank 1's three step-5 spans, and the three good spans of rank 0 (sent six times, kept once)
        assert got["count"] == 6 and got["rank"].count(0) == 3
