"""Expert loads by RL phase over real gRPC into a real store (SQLite and PostgreSQL), read
back over REST: stored once by (job, rank, step, phase), summed per phase, bad input refused
by name with the rest of the report stored."""

from __future__ import annotations

import httpx
import numpy as np

from moeplane.agents.rlreport import phase_loads, rl_report
from moeplane.controlplane.store import rl_loads
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import encode_array
from tests import aio
from tests.controlplane.agentclient import ScriptedAgent, hello
from tests.controlplane.serverthread import running_server

INVALID_ARGUMENT = 3
L, E = 4, 8  # the job of agentclient.hello


def _counts(seed: int, hot: int) -> np.ndarray:
    """int64 [L, E]: expert ``hot`` of every layer gets 10x the tokens of the others."""
    c = np.random.default_rng(seed).integers(10, 20, size=(L, E))
    c[:, hot] *= 10
    return c


def _report(steps=(0, 1), ranks=(0, 1)) -> tuple[pb.RLReport, dict[str, np.ndarray]]:
    """Per step and rank, loads for generate (hot expert 0) and train_update (hot expert 5);
    and their sums per phase."""
    loads, sums = [], {"generate": np.zeros((L, E), np.int64), "train_update": np.zeros((L, E), np.int64)}
    for s in steps:
        for r in ranks:
            for phase, hot in (("generate", 0), ("train_update", 5)):
                c = _counts(100 * s + 10 * r + hot, hot)
                sums[phase] += c
                loads.append(phase_loads(s, r, phase, c, 1000.0 + s))
    return rl_report("job-1", loads=loads), sums


def test_phase_loads_stored_once_and_summed_per_phase(database_url):
    report, sums = _report()
    with running_server(database_url) as srv:

        async def script():
            for attempt in range(2):  # the second stream resends: acks say duplicate
                async with ScriptedAgent(srv["grpc_port"]) as agent:
                    agent.send(hello())
                    agent.send(pb.AgentMessage(seq=1, rl=report))
                    acks = await agent.wait_acks([1])
                    assert acks[1].code == 0, acks[1].message
                    assert acks[1].duplicate == (attempt == 1)
            async with ScriptedAgent(srv["grpc_port"]) as agent:  # renumbered after a lost spool
                agent.send(hello())
                agent.send(pb.AgentMessage(seq=2, rl=report))
                assert (await agent.wait_acks([2]))[2].code == 0

        aio.run(script())
        base = f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs"
        with httpx.Client(base_url=f"{base}/job-1/rl", timeout=10) as api:
            got = api.get("/loads", params={"step_start": 0, "step_end": 2}).json()
            assert (got["layers"], got["experts"]) == (L, E)
            by = {p["phase"]: p for p in got["phases"]}
            assert set(by) == {"generate", "train_update"}
            for name, p in by.items():
                assert np.array_equal(p["counts"], sums[name])  # 4 rows each, stored once
                assert (p["steps"], p["ranks"], p["rows"]) == (2, 2, 4)
                assert p["tokens"] == int(sums[name].sum())
                mom = sums[name].max(axis=1) / sums[name].mean(axis=1)
                np.testing.assert_allclose(p["max_over_mean"], mom)
                np.testing.assert_allclose(np.sum(p["share"], axis=1), 1.0)
            assert np.argmax(by["generate"]["counts"][0]) == 0 and np.argmax(by["train_update"]["counts"][0]) == 5
            one = api.get("/loads", params={"step_start": 1, "step_end": 2}).json()
            assert [p["rows"] for p in one["phases"]] == [2, 2]
            assert api.get("/loads").json()["step_end"] == 2  # newest steps by default
            assert api.get("/loads", params={"step_start": 3, "step_end": 3}).status_code == 422
            assert api.get("/loads", params={"step_start": -1}).status_code == 422
            assert api.get("/loads", params={"step_start": 0, "step_end": 10**6}).status_code == 422
            assert api.get("/loads", params={"step_start": 5, "step_end": 6}).json()["phases"] == []
        assert httpx.get(f"{base}/nope/rl/loads").status_code == 404


def test_bad_phase_loads_are_refused_by_name_and_the_rest_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    good = phase_loads(0, 0, "generate", _counts(0, 1), 1000.0)

    def bad(**changes) -> pb.PhaseLoads:
        p = pb.PhaseLoads()
        p.CopyFrom(good)
        p.step = 1  # another key than ``good``'s, so that only the check refuses it
        for k, v in changes.items():
            if k == "counts":
                p.counts.CopyFrom(encode_array(v))
            else:
                setattr(p, k, v)
        return p

    cases = {
        2: (bad(phase="dream"), "rl.phase_loads[1].phase", "'dream' is not a known phase"),
        3: (bad(counts=np.ones((L, E + 1), np.int32)), "rl.phase_loads[1].counts.shape", "dimension 1 is 9"),
        4: (bad(counts=np.ones((L + 1, E), np.int32)), "rl.phase_loads[1].counts.shape", "dimension 0 is 5"),
        5: (bad(counts=np.full((L, E), 0.5)), "rl.phase_loads[1].counts.dtype", "float64"),
        6: (bad(counts=np.full((L, E), -1, np.int32)), "rl.phase_loads[1].counts", "negative"),
        7: (bad(rank=2), "rl.phase_loads[1].rank", "not a rank of node 'node-0'"),
        8: (bad(rank=-1), "rl.phase_loads[1].rank", "< 0"),
        9: (bad(step=-1), "rl.phase_loads[1].step", "< 0"),
        10: (bad(timestamp=float("nan")), "rl.phase_loads[1].timestamp", "not a unix time"),
    }
    with running_server(url) as srv:

        async def script():
            async with ScriptedAgent(srv["grpc_port"]) as agent:
                agent.send(hello())  # node-0 runs ranks 0 and 1 of job-1, [L, E] = [4, 8]
                for seq, (msg, _field, _why) in cases.items():
                    agent.send(pb.AgentMessage(seq=seq, rl=rl_report("job-1", loads=[good, msg])))
                acks = await agent.wait_acks(cases)
                for seq, (_msg, field, why) in cases.items():
                    assert acks[seq].code == INVALID_ARGUMENT, (seq, acks[seq].message)
                    assert acks[seq].message.startswith(field + ":"), (seq, acks[seq].message)
                    assert why in acks[seq].message, (seq, acks[seq].message)
                    assert "1 of 2 items refused; the rest stored" in acks[seq].message
                # a job whose hello declared no [L, E]: nothing to check counts against
                agent.send(hello(job_id="job-2", layers=0))
                agent.send(pb.AgentMessage(seq=11, rl=rl_report("job-2", loads=[good])))
                ack = (await agent.wait_acks([11]))[11]
                assert ack.code == INVALID_ARGUMENT and ack.message.startswith("rl.phase_loads[0].counts:")
                assert "no [L, E]" in ack.message

        aio.run(script())
        from moeplane.controlplane.store.engine import make_engine

        engine = make_engine(url)
        sums = rl_loads.sum_by_phase(engine, "job-1", 0, 10)
        engine.dispose()
        # the good row (sent nine times) is stored once; no bad row (all of step 1) is stored
        assert sums.rows.tolist() == [1] and sums.steps.tolist() == [1]
        assert np.array_equal(sums.counts[0], _counts(0, 1))


def test_phase_loads_read_needs_a_viewer_token(tmp_path):
    from moeplane.controlplane.auth.tokens import Role, TokenStore
    from tests.auth.streams import first_reply

    with running_server(f"sqlite:///{tmp_path / 'a.sqlite'}", auth=True) as srv:
        tokens = TokenStore(srv["engine"])
        node = tokens.create(Role.NODE, node_id="node-0").secret
        assert aio.run(first_reply(srv["grpc_port"], "node-0", node))[0] == "ok"  # job-1 exists
        url = f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/job-1/rl/loads"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {node}"}).status_code == 403
        viewer = tokens.create(Role.VIEWER).secret
        r = httpx.get(url, headers={"Authorization": f"Bearer {viewer}"})
        assert r.status_code == 200 and r.json()["phases"] == []
