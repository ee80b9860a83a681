"""The rank SDK: phase spans, policy versions and batch staleness, from a training process's
recorder through a real node agent process into the control plane, read back over REST."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from moeplane.agents.sdk import rl
from moeplane.controlplane.procs import wait_until
from moeplane.controlplane.rl.phases import PHASE_CODE
from moeplane.controlplane.wire import moeplane_pb2 as pb
from moeplane.controlplane.wire.arrays import decode_array
from tests.rl.agentrun import sdk_agent


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_recorder_batches_spans_and_checks_names():
    sent: list[pb.RLReport] = []
    clock = Clock()
    rec = rl.PhaseRecorder(sent.append, job_id="j", rank=3, role="rollout", flush_spans=3,
                           flush_interval_s=60.0, clock=clock)
    rec.policy_version(2)
    for step in range(2):
        with rec.phase("generate", step=step) as span:
            clock.t += 4.0
            span.tokens = 100 + step
        clock.t += 1.0
    assert sent == []  # under both thresholds
    with rec.phase("wait"):
        clock.t += 0.5
    assert len(sent) == 1
    spans = sent[0].spans
    assert decode_array(spans.rank, "r").tolist() == [3, 3, 3]
    assert decode_array(spans.version, "v").tolist() == [2, 2, 2]
    assert decode_array(spans.tokens, "t").tolist() == [100, 101, 0]
    assert decode_array(spans.step, "s").tolist() == [0, 1, 1]
    assert decode_array(spans.end, "e").tolist() == [1004.0, 1009.0, 1010.5]
    phase_names = list(spans.phase_names)
    assert [phase_names[i] for i in decode_array(spans.phase, "p", kinds="iu")] == ["generate", "generate", "wait"]
    with pytest.raises(ValueError, match="policy_version"):
        rec.policy_version(1)
    with pytest.raises(ValueError, match="'dream'"), rec.phase("dream"):
        pass
    rec.consumed_batch(1, trained_version=3, sample_versions=[1, 2, 2, 3], bound=2, dropped=1)
    rec.flush()
    b = sent[-1].batches[0]
    assert (b.samples, b.lag_min, b.lag_mean, b.lag_max, b.bound, b.dropped) == (4, 0, 1.0, 2, 2, 1)


def test_module_functions_do_nothing_until_attached():
    rl.detach_rl()
    with rl.phase("generate", tokens=5) as span:
        assert span.tokens == 5
    rl.policy_version(7)  # no recorder: no error, nothing kept
    with pytest.raises(ValueError, match="phase"), rl.phase("nap"):
        pass


def test_spans_reach_rest_through_a_real_agent(tmp_path):
    torch = pytest.importorskip("torch")
    from moeplane.torch import Reporter, attach_rl, consumed_batch, detach_rl, phase, policy_version

    with sdk_agent(tmp_path) as (srv, sock):
        reporter = Reporter(torch.zeros((1, 1), dtype=torch.int64), rank=0, socket_path=sock,
                            job=pb.JobSpec(job_id="grpo", layers=1, experts=1)).start()
        clock = Clock()
        attach_rl(reporter.send_report, job_id="grpo", rank=0, role="hybrid", clock=clock)
        for step in range(3):
            policy_version(step)
            for name, seconds in (("generate", 6.0), ("offload", 0.5), ("train_update", 3.0),
                                  ("weight_sync", 0.5), ("onload", 0.5)):
                with phase(name, step=step, tokens=10 if name == "generate" else 0):
                    clock.t += seconds
            consumed_batch(step, trained_version=step, sample_versions=[step] * 8, bound=0)
        detach_rl()
        reporter.close()
        api = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/grpo/rl", timeout=10)
        got = wait_until(lambda: (r := api.get("/spans", params={"step_start": 0, "step_end": 3}).json())
                         .get("count") == 15 and r, 60, "15 spans over REST",
                         retry_on=(OSError, httpx.HTTPError))
        assert got["version"] == [s for s in range(3) for _ in range(5)]
        assert set(got["node"]) == {"node-0"} and got["tokens"].count(10) == 3
        assert np.allclose(np.subtract(got["end"], got["start"]).sum(), 3 * 10.5)
        assert [b["lag_max"] for b in api.get("/batches").json()] == [0, 0, 0]
        idle = api.get("/idle", params={"step_start": 0, "step_end": 3}).json()["summary"]
        assert idle["black_hole_fraction"] == 0.0 and idle["switch_share"] == pytest.approx(1 / 10.5)
        assert PHASE_CODE["generate"] == 0
