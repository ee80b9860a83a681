"""``moeplane replay`` as a real process: the report of a small trace, and bad input refused
with exit status 2 and one line naming what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import sqlalchemy as sa

from harness.traces import drifting_trace
from moeplane.controlplane.store import migrate
from moeplane.controlplane.store import tables as t

pytestmark = pytest.mark.slow


def run_replay(*args):
    return subprocess.run(
        [sys.executable, "-m", "moeplane.controlplane.cli.main", "replay", *map(str, args)],
        capture_output=True, text=True, timeout=300,
    )


def save(tmp_path, arr, name="trace.npy"):
    path = tmp_path / name
    np.save(path, arr)
    return path


def test_replays_every_policy_on_a_trace(tmp_path):
    trace = np.rint(drifting_trace(40, 3, 16, tokens_per_layer=8000, seed=2, drift=0.05))
    report = tmp_path / "r.json"
    res = run_replay("--trace", save(tmp_path, trace.astype(np.int64)), "--gpus", 4,
                     "--slots-per-gpu", 5, "--nodes", 2, "--bandwidth", "1e11,2.5e10",
                     "--report", report)
    assert res.returncode == 0, res.stderr
    rep = json.loads(report.read_text())
    assert rep["steps"] == 20 and set(rep["policies"]) == {
        "controller", "once", "eplb@10", "eplb@50", "oracle"}
    for run in rep["policies"].values():
        assert len(run["expert_s"]) == 20
        assert run["total_s_per_step"] == pytest.approx(
            run["expert_s_per_step"] + run["stall_s_per_step"])
    assert rep["policies"]["eplb@10"]["plans"] == 1  # step 30 (20 is the start)
    # the oracle re-plans every step for free: no policy beats its expert time
    oracle = rep["policies"]["oracle"]["expert_s_per_step"]
    assert all(r["expert_s_per_step"] >= oracle * 0.999 for r in rep["policies"].values())
    ours = rep["policies"]["controller"]["total_s_per_step"]
    assert rep["speedup"]["vs_once"] == pytest.approx(
        rep["policies"]["once"]["total_s_per_step"] / ours)
    assert "the better EPLB cadence" in res.stdout


def test_replay_with_groups_keeps_them_and_pays_for_it(tmp_path):
    trace = np.rint(drifting_trace(30, 2, 16, tokens_per_layer=8000, seed=3, drift=0.05))
    path = save(tmp_path, trace.astype(np.int64))
    reports = {}
    for extra in ((), ("--groups", 4)):
        reports[extra] = tmp_path / f"r{len(extra)}.json"
        res = run_replay("--trace", path, "--gpus", 4, "--slots-per-gpu", 5, "--nodes", 2,
                         "--report", reports[extra], *extra)
        assert res.returncode == 0, res.stderr
    free, grouped = (json.loads(r.read_text()) for r in reports.values())
    assert free["groups"] is None and grouped["groups"] == 4
    # every group held on one node (2 nodes, 16 experts in 4 groups) costs the oracle and
    # EPLB (hierarchical) balance on this trace: the groups were kept
    for name in ("oracle", "once"):
        assert grouped["policies"][name]["expert_s_per_step"] > \
            free["policies"][name]["expert_s_per_step"] * 1.05


@pytest.mark.parametrize(
    "arr,args,message",
    [
        (np.ones((30, 16)), (), "--trace: expected [steps, layers, experts], got 2 dimensions"),
        (np.ones((30, 2, 16), dtype=bool), (), "--trace: expected integer or float tokens"),
        (-np.ones((30, 2, 16)), (), "--trace: loads must be non-negative"),
        (np.ones((30, 2, 16)), ("--slots-per-gpu", 3), "--gpus * --slots-per-gpu = 12 is fewer"),
        (np.ones((10, 2, 16)), (), "--trace: 10 steps, need more than --warmup 20"),
        (np.ones((30, 2, 16)), ("--groups", 3), "--groups: groups = 3 does not divide the 16"),
        (np.ones((30, 2, 16)), ("--groups", 1, "--nodes", 2),
         "--groups: groups = 1 is not a multiple of nodes = 2"),
        (np.ones((30, 2, 16)), ("--groups", 0), "--groups: must be >= 1, got 0"),
    ],
)
def test_bad_traces_exit_2_with_one_line(tmp_path, arr, args, message):
    base = {"--gpus": 4, "--slots-per-gpu": 5}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in base.items() for x in kv]
    res = run_replay("--trace", save(tmp_path, arr), *flat)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_a_job_without_stored_loads_exits_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url, "head")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.insert(t.jobs).values(job_id="quiet", created_at=time.time()))
    engine.dispose()
    for job, message in (("quiet", "job 'quiet' has no stored loads"), ("ghost", "no job 'ghost'")):
        res = run_replay("--job", job, "--database-url", url, "--gpus", 4, "--slots-per-gpu", 5)
        assert res.returncode == 2
        assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_a_stored_job_is_replayed_on_its_own_geometry_and_groups(tmp_path):
    from moeplane.controlplane.store.records import HelloRecord, JobRecord, LoadsRecord
    from moeplane.controlplane.store.writes import StoreWriter

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url, "head")
    engine = sa.create_engine(url)
    loads = np.rint(drifting_trace(30, 2, 16, tokens_per_layer=8000, seed=3, drift=0.05))
    writer = StoreWriter(engine)
    for node, ranks in (("n0", (0, 1)), ("n1", (2, 3))):
        writer.register_hello(HelloRecord(node, "h", "v", "grouped", ranks, (), JobRecord(
            "grouped", layers=2, experts=16, world_size=4, slots_per_rank=5, ranks_per_node=2,
            groups=4), 1.0))
    writer.write([LoadsRecord("n0", 1 + i, "grouped", i, 1.0 + i, (0, 1, 2, 3), (),
                              loads[i].astype(np.int64)) for i in range(30)])
    engine.dispose()
    report = tmp_path / "r.json"
    res = run_replay("--job", "grouped", "--database-url", url, "--report", report)
    assert res.returncode == 0, res.stderr
    assert "on 4 GPUs x 5 slots, 2 node(s), 4 groups" in res.stdout
    rep = json.loads(report.read_text())
    assert rep["groups"] == 4 and rep["steps"] == 10
    # the same as the trace replayed with that geometry given
    trace = save(tmp_path, loads.astype(np.int64))
    res = run_replay("--trace", trace, "--gpus", 4, "--slots-per-gpu", 5, "--nodes", 2,
                     "--groups", 4, "--report", tmp_path / "t.json")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "t.json").read_text())["policies"] == rep["policies"]
    res = run_replay("--trace", trace, "--slots-per-gpu", 5)
    assert res.returncode == 2 and "--gpus: required with --trace" in res.stderr
