"""Expert loads by RL phase from a real tiny transformers MoE policy (random weights): the
recorder takes them from ``moeplane.torch.attach(model)`` at each phase block's edges, sums a
step's blocks per phase, and sends them through a real node agent process into the control
plane, read back over REST."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moeplane.agents.sdk import rl  # noqa: E402
from moeplane.controlplane.procs import wait_until  # noqa: E402
from moeplane.controlplane.wire import moeplane_pb2 as pb  # noqa: E402
from moeplane.controlplane.wire.arrays import decode_array  # noqa: E402
from tests.adapters.hf_models import batch, build  # noqa: E402
from tests.rl.agentrun import sdk_agent  # noqa: E402

L, E, TOP_K = 2, 8, 2
PROMPT, NEW = 6, 5  # prompt tokens, generated tokens


def _rollout(model, seed: int) -> None:
    """Greedy generation of NEW tokens after a [2, PROMPT] prompt (KV cache: one token a step)."""
    with torch.no_grad():
        model.generate(batch(seed, 2, PROMPT), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                       pad_token_id=0)


def _train(model, seed: int) -> None:
    """One forward and backward over a [4, 12] batch (the hooks count the forward only)."""
    ids = batch(seed, 4, 12)
    model(ids, labels=ids).loss.backward()


def _expected(model, watch, steps: int) -> dict[str, np.ndarray]:
    """The loads of the same work measured by hand: ``watch.take()`` around each piece."""
    out = {"generate": np.zeros((L, E), np.int64), "train_update": np.zeros((L, E), np.int64)}
    for step in range(steps):
        watch.take()
        _rollout(model, step)
        out["generate"] += watch.take().numpy()
        _train(model, 100 + step)
        out["train_update"] += watch.take().numpy()
    return out


def _loads(report: pb.RLReport) -> list[tuple[int, str, np.ndarray]]:
    return [(p.step, p.phase, decode_array(p.counts, "c", kinds="iu")) for p in report.phase_loads]


def test_phase_blocks_send_their_loads_once_per_step_and_phase():
    from moeplane.torch import attach

    model = build("mixtral", layers=L, experts=E, top_k=TOP_K)
    watch = attach(model)
    expected = _expected(model, watch, 1)
    sent: list[pb.RLReport] = []
    rec = rl.PhaseRecorder(sent.append, job_id="j", rank=0, watch=watch, flush_spans=1)
    _train(model, 7)  # outside any phase block: dropped
    with rec.phase("generate", step=0):
        _rollout(model, 0)
    with rec.phase("train_update", step=0):
        with rec.phase("weight_sync"):  # nothing routed inside: no loads for it
            pass
        _train(model, 100)  # after the inner block: still train_update's
    with rec.phase("wait", step=0):
        pass
    assert all(not r.phase_loads for r in sent)  # step 0 is still the current step
    with rec.phase("generate", step=1):
        pass
    loads = _loads(sent[-1])
    assert [(s, p) for s, p, _ in loads] == [(0, "generate"), (0, "train_update")]
    assert np.array_equal(loads[0][2], expected["generate"])
    assert np.array_equal(loads[1][2], expected["train_update"])
    # per layer, generation routes TOP_K ids for each prompt token and each fed-back token
    assert loads[0][2].sum(axis=1).tolist() == [TOP_K * 2 * (PROMPT + NEW - 1)] * L
    assert loads[1][2].sum(axis=1).tolist() == [TOP_K * 4 * 12] * L
    # a phase run in two blocks of one step is summed into one row
    with rec.phase("generate", step=2):
        _rollout(model, 0)
    with rec.phase("generate", step=2):
        _rollout(model, 0)
    rec.flush(final=True)
    assert [(s, p) for s, p, _ in _loads(sent[-1])] == [(2, "generate")]
    assert np.array_equal(_loads(sent[-1])[0][2], 2 * expected["generate"])


def test_loads_by_phase_reach_rest_through_a_real_agent(tmp_path):
    from moeplane.torch import Reporter, attach, attach_rl, detach_rl, phase

    model = build("mixtral", layers=L, experts=E, top_k=TOP_K)
    watch = attach(model)
    steps = 2
    expected = _expected(model, watch, steps)
    with sdk_agent(tmp_path) as (srv, sock):
        reporter = Reporter(torch.zeros((L, E), dtype=torch.int64), rank=0, socket_path=sock,
                            job=pb.JobSpec(job_id="grpo", layers=L, experts=E, top_k=TOP_K)).start()
        attach_rl(reporter.send_report, job_id="grpo", rank=0, role="hybrid", watch=watch)
        for step in range(steps):
            with phase("generate", step=step):
                _rollout(model, step)
            with phase("train_update", step=step):
                _train(model, 100 + step)
        detach_rl()
        reporter.close()
        api = httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs/grpo/rl", timeout=10)

        def both():
            got = api.get("/loads", params={"step_start": 0, "step_end": steps}).json()
            return got if [p.get("rows") for p in got.get("phases", [])] == [steps, steps] else None

        got = wait_until(both, 60, "generate and train_update loads over REST", retry_on=(OSError, httpx.HTTPError))
        by = {p["phase"]: p for p in got["phases"]}
        assert set(by) == {"generate", "train_update"}
        for name in by:
            assert np.array_equal(by[name]["counts"], expected[name])
