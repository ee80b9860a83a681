"""Four real gloo processes: placement and per-step replica routing are invisible to the math;
each rank processes exactly the tokens routing predicts; bad plans are rejected and training
continues on the running placement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moeplane.controlplane.balancing import gpu_loads, layer_balancedness, route_replicas
from moeplane.controlplane.procs import free_port
from moeplane.controlplane.wire import moeplane_pb2 as pb

pytestmark = [pytest.mark.torch, pytest.mark.slow]
WORLD = 4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist")
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.sdk.dist_worker", str(out)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def logical(ranks: list[dict], run: str) -> dict:
    """(layer, expert) -> every replica's [w1, w3, w2], gathered over ranks."""
    out: dict = {}
    for result in ranks:
        for key, replicas in result[run]["weights"].items():
            out.setdefault(key, []).extend(replicas)
    return out


def test_moving_experts_mid_training_changes_nothing_in_the_math(ranks):
    static, moved = ranks[0]["static"], ranks[0]["moved"]
    applied = [r for r in moved["reports"] if r[1] == pb.PLAN_STATE_APPLIED]
    assert [r[0] for r in applied] == [3, 5]
    assert not np.array_equal(moved["phy2log"], ranks[0]["static"]["phy2log"])
    np.testing.assert_allclose(moved["losses"], static["losses"], rtol=0, atol=1e-5)
    a, b = logical(ranks, "static"), logical(ranks, "moved")
    assert set(a) == set(b) == {(layer, e) for layer in range(2) for e in range(8)}
    replica_counts = {key: len(v) for key, v in b.items()}
    assert max(replica_counts.values()) >= 2 and min(replica_counts.values()) == 1
    for key in a:
        for replica in b[key]:  # replicas are bit-identical to each other
            for w0, w in zip(b[key][0], replica, strict=True):
                assert torch.equal(w0, w), key
        for wa, wb in zip(a[key][0], b[key][0], strict=True):
            torch.testing.assert_close(wb, wa, rtol=0, atol=1e-5)


def test_every_rank_switches_at_the_same_step(ranks):
    # rank 0 received epoch 3 one step before the others: it must wait for them
    switches = {
        (r[0], r[2]) for result in ranks for r in result["moved"]["reports"] if r[1] == 2
    }
    assert switches == {(3, 4), (5, 7)}
    for result in ranks:
        assert result["moved"]["epoch"] == 5
        np.testing.assert_array_equal(result["moved"]["phy2log"], ranks[0]["moved"]["phy2log"])


def balancedness(per_rank: np.ndarray) -> float:
    return float(layer_balancedness(per_rank).mean())


def test_measured_tokens_per_rank_are_what_routing_predicts(ranks):
    # routing on: each rank processes exactly the tokens route_replicas gives its slots,
    # before and after the rebalancing plan, measured on the same batch
    bal = ranks[0]["moved"]["balance"]
    loads, target = bal["loads"], bal["target"]
    for placement, measured in ((bal["running"], bal["before"]), (target, bal["after"])):
        predicted = route_replicas(loads, placement, gpus=WORLD).reshape(2, WORLD, -1).sum(2)
        np.testing.assert_array_equal(measured, predicted)
        assert balancedness(measured) <= balancedness(gpu_loads(loads, placement, WORLD))
    assert balancedness(bal["after"]) < balancedness(bal["before"])
    np.testing.assert_array_equal(ranks[0]["moved"]["phy2log"], target)


def test_routing_off_splits_replicated_experts_evenly(ranks):
    bal = ranks[0]["static"]["balance"]
    even = gpu_loads(bal["loads"], bal["running"], WORLD)
    np.testing.assert_allclose(bal["before"], even, rtol=0.05)  # each sender: j mod replicas
    routed = route_replicas(bal["loads"], bal["running"], gpus=WORLD).reshape(2, WORLD, -1)
    assert balancedness(routed.sum(2)) < balancedness(bal["before"])


def test_bad_plans_are_rejected_with_clear_errors(ranks):
    for result in ranks:
        failed = [(r[0], r[3]) for r in result["moved"]["reports"] if r[1] == pb.PLAN_STATE_FAILED]
        errors = [e for _, e in failed]
        assert errors[0] == "plan.phy2log: shape (1, 12) does not match the model's (2, 12)"
        assert errors[1].startswith("plan.phy2log: unknown expert id 8")
        assert errors[2] == "plan.slots_per_rank: 2 slots per rank, the model has 3"
        assert errors[3] == "plan.epoch: epoch 1 is not newer than the running 1"
        assert failed[4] == (4, "plan.phy2log: ranks hold different plans under epoch 4")
        assert len(failed) == 5
