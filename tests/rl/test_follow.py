"""Following verl's and AReaL's log files: records become spans; malformed lines are counted
and skipped; through a real agent process the spans reach REST. Fixtures: see fixtures/README.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from moeplane.agents.follow.tail import Follower, parse_follow
from moeplane.controlplane.procs import spawn, wait_until
from moeplane.controlplane.rl import idle
from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans
from moeplane.controlplane.wire.arrays import decode_array
from tests.controlplane.serverthread import running_server

FIXTURES = Path(__file__).with_name("fixtures")


class Clock:
    def __init__(self, t: float = 5000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _spans(report) -> Spans:
    s = report.spans
    col = {name: decode_array(getattr(s, name), name, kinds="iuf") for name in
           ("step", "rank", "version", "phase", "role", "start", "end", "tokens")}
    return Spans.build(col["step"], col["rank"], col["version"], [s.phase_names[i] for i in col["phase"]],
                       [s.role_names[i] for i in col["role"]], col["start"], col["end"], col["tokens"])


def test_verl_records_become_job_spans_and_bad_lines_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = (FIXTURES / "verl_metrics.jsonl").read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"{not json\n" + b'{"step": -3, "data": {}}\n' + lines[1] + lines[2][:40])
    clock = Clock()
    follower = Follower("verl", path, lambda m: None, job_id=lambda: "v", clock=clock)
    spans = _spans(follower.poll())
    assert follower.malformed == 2
    assert sorted(set(spans.step.tolist())) == [1, 2]  # the half-written third line waits
    assert set(spans.rank.tolist()) == {-1} and {ROLES[r] for r in spans.role} == {"hybrid"}
    first = spans.take(spans.step == 1)
    assert [PHASES[p] for p in first.phase] == ["generate", "reward", "logprob_old", "logprob_ref", "advantage",
                                                  "train_update", "weight_sync"]
    second = spans.take(spans.step == 2)  # records read together lie end to end, the last ending now
    assert second.end.max() == clock.t and first.end.max() == second.start.min() == clock.t - 648.25
    assert first.start.min() == pytest.approx(clock.t - 648.25 - 628.25)
    assert np.all(first.start[1:] == first.end[:-1])  # laid end to end
    assert first.tokens[0] == 4_194_305 and first.version.tolist() == [0] * 7
    with open(path, "ab") as f:
        f.write(lines[2][40:] + lines[3] + lines[4])
    clock.t += 700
    report = follower.poll()
    later = _spans(report)
    assert sorted(set(later.step.tolist())) == [3, 4, 5] and follower.malformed == 2
    async_step = later.take(later.step == 5)
    gen = async_step.take(async_step.phase == PHASES.index("generate"))
    assert ROLES[gen.role[0]] == "rollout" and async_step.version[0] == 4
    assert [(b.step, b.lag_max, b.dropped, b.partial) for b in report.batches] == [(4, 1, 8, 17), (5, 1, 10, 17)]
    assert [(s.from_version, s.to_version) for s in report.syncs] == [(2, 3), (3, 4), (4, 5)]
    assert follower.poll() is None


def test_areal_traces_become_device_spans(tmp_path):
    shutil.copytree(FIXTURES / "areal", tmp_path / "trial")
    with open(tmp_path / "trial" / "traces-r1.jsonl", "a") as f:
        f.write('{"name": "train.ppo_update", "ph": "X", "ts": "soon"}\n')
    follower = Follower("areal", tmp_path / "trial", lambda m: None, job_id=lambda: "a", clock=Clock())
    spans = _spans(follower.poll())
    assert follower.malformed == 1
    assert sorted(set(spans.rank.tolist())) == [0, 1] and sorted(set(spans.step.tolist())) == [0, 1]
    assert spans.end.max() == 5000.0  # anchored at the first read
    rep = idle.analyze(spans)
    tail = idle.CAUSES.index("generation_tail")
    # rank 0 waits 8 s per step for rank 1's rollouts
    np.testing.assert_allclose(rep.idle_cause[:, 0, tail], [8.0, 8.0])
    np.testing.assert_allclose(rep.idle[:, 1], [0.0, 0.0], atol=1e-6)


def test_follow_argument_names_what_is_wrong():
    assert parse_follow("areal=/x") == ("areal", Path("/x"))
    for bad in ("verl", "openrlhf=/x", "verl="):
        with pytest.raises(ValueError, match="--follow"):
            parse_follow(bad)


def test_an_agent_following_both_formats_sends_spans_to_rest(tmp_path):
    verl_file = tmp_path / "verl.jsonl"
    shutil.copyfile(FIXTURES / "verl_metrics.jsonl", verl_file)
    shutil.copytree(FIXTURES / "areal", tmp_path / "areal")
    with running_server(f"sqlite:///{tmp_path / 'f.sqlite'}") as srv:
        agent = spawn("agent", ["agent", "--node-id", "node-0", "--server", f"127.0.0.1:{srv['grpc_port']}",
                                "--collector", "sim", "--devices", "2", "--job-id", "rl", "--ranks", "0-1",
                                "--local-socket", str(tmp_path / "a.sock"), "--spool-dir", str(tmp_path / "spool"),
                                "--follow", f"verl={verl_file}", "--follow", f"areal={tmp_path / 'areal'}"], tmp_path)
        try:
            api = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/rl/rl", timeout=10)

            # AReaL: 2 ranks x 2 steps x 8 mapped scopes; verl: 3 steps x 7 stages + 2 steps x 6
            want = 2 * 2 * 8 + 3 * 7 + 2 * 6
            seen: list[int] = []

            def spans():
                r = api.get("/spans", params={"step_start": 0, "step_end": 6})
                seen.append(r.json().get("count", -1) if r.status_code == 200 else r.status_code)
                return r.status_code == 200 and r.json()["count"] == want and r.json()

            try:
                got = wait_until(spans, 60, "the followed spans over REST", retry_on=(OSError, httpx.HTTPError))
            except TimeoutError as exc:
                last = api.get("/spans", params={"step_start": 0, "step_end": 6}).json()
                pairs = sorted({(r, s) for r, s in zip(last["rank"], last["step"], strict=True)})
                raise AssertionError(f"span counts seen: {seen[-3:]} {pairs}\n{agent.output()[-3000:]}") from exc
            assert set(got["rank"]) == {-1, 0, 1}
            assert {p for p, r in zip(got["phase"], got["rank"], strict=True) if r >= 0} >= {"generate", "onload"}
            assert len(api.get("/batches").json()) == 2 and len(api.get("/syncs").json()) == 5
        finally:
            agent.stop()
        assert "Traceback" not in agent.output()
