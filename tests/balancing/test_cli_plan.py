"""``moeplane plan`` run as the real console command."""

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moeplane.controlplane.balancing import balancedness, count_moves, replica_counts
from moeplane.controlplane.balancing.slots import slot_changes

MOEPLANE = str(Path(sys.executable).with_name("moeplane"))


def run_plan(*args):
    return subprocess.run([MOEPLANE, "plan", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def loads_file(tmp_path):
    loads = np.random.default_rng(0).lognormal(0, 1, size=(4, 16)) * 1000
    path = tmp_path / "loads.npy"
    np.save(path, loads)
    return path, loads


def test_fresh_plan_writes_plan_and_report(tmp_path, loads_file):
    path, loads = loads_file
    out, report = tmp_path / "plan.npy", tmp_path / "report.json"
    res = run_plan("--loads", path, "--gpus", 4, "--slots-per-gpu", 5, "--out", out,
                   "--report", report)
    assert res.returncode == 0, res.stderr
    plan = np.load(out)
    assert plan.dtype == np.int64 and plan.shape == (4, 20)
    assert (replica_counts(plan, 16) >= 1).all()
    rep = json.loads(report.read_text())
    identity = np.tile(np.arange(20) % 16, (4, 1))
    assert rep["balancedness_before"] == pytest.approx(balancedness(loads, identity, 4))
    assert rep["balancedness_after"] == pytest.approx(balancedness(loads, plan, 4))
    assert rep["moved"] == count_moves(identity, plan, 4, 16).sum()
    assert rep["cross_node_moved"] == 0
    assert rep["elapsed_ms"] >= 0


def test_incremental_plan_respects_max_moves(tmp_path, loads_file):
    path, loads = loads_file
    current = np.tile(np.arange(20) % 16, (4, 1)).astype(np.int64)
    np.save(tmp_path / "cur.npy", current)
    out, report = tmp_path / "plan.npy", tmp_path / "report.json"
    res = run_plan("--loads", path, "--gpus", 4, "--slots-per-gpu", 5, "--nodes", 2,
                   "--current", tmp_path / "cur.npy", "--max-moves", 6, "--out", out,
                   "--report", report)
    assert res.returncode == 0, res.stderr
    rep = json.loads(report.read_text())
    plan = np.load(out)
    assert rep["moved"] == count_moves(current, plan, 4, 16).sum() <= 6
    assert rep["balancedness_after"] < rep["balancedness_before"]
    assert rep["slot_changes"] == slot_changes(current, plan, 4).sum()
    stays = np.zeros_like(current, dtype=bool)  # slots whose expert is still on their GPU
    for lay in range(4):
        for g in range(4):
            block = slice(5 * g, 5 * g + 5)
            stays[lay, block] = np.isin(current[lay, block], plan[lay, block])
    np.testing.assert_array_equal(plan[stays], current[stays])  # and keeps its slot


@pytest.mark.parametrize("search", ["relieve", "repair"])
def test_incremental_plan_with_each_search_reaches_the_tolerance(tmp_path, search):
    from moeplane.controlplane.balancing import eplb_greedy

    rng = np.random.default_rng(3)
    old = rng.lognormal(0, 1, size=(4, 16)) * 1000
    new = old * rng.lognormal(0, 0.5, size=old.shape)
    np.save(tmp_path / "loads.npy", new)
    np.save(tmp_path / "cur.npy", eplb_greedy(old, 4, 5))
    out, report = tmp_path / "plan.npy", tmp_path / "report.json"
    res = run_plan("--loads", tmp_path / "loads.npy", "--gpus", 4, "--slots-per-gpu", 5,
                   "--current", tmp_path / "cur.npy", "--search", search, "--out", out,
                   "--report", report)
    assert res.returncode == 0, res.stderr
    rep = json.loads(report.read_text())
    fresh = balancedness(new, eplb_greedy(new, 4, 5), 4)
    assert rep["balancedness_after"] <= fresh + 0.01 + 1e-12
    assert rep["moved"] == count_moves(np.load(tmp_path / "cur.npy"), np.load(out), 4, 16).sum()
    assert rep["search"] == search


@pytest.mark.parametrize(
    ("make", "args", "words"),
    [
        (None, ["--loads", "{tmp}/missing.npy"], "no such file"),
        ("text", ["--loads", "{tmp}/bad.npy"], "is not a .npy file"),
        ("truncated", ["--loads", "{tmp}/bad.npy"], "cannot read"),
        (None, ["--loads", "{loads}", "--gpus", "2"], "fewer than"),
        (None, ["--loads", "{loads}", "--nodes", "3"], "nodes"),
        ("cur_float", ["--loads", "{loads}", "--current", "{tmp}/cur.npy"], "int64"),
        ("cur_shape", ["--loads", "{loads}", "--current", "{tmp}/cur.npy"], "shape"),
        (None, ["--loads", "{loads}", "--max-moves", "3"], "current"),
        (None, ["--loads", "{loads}", "--gpus", "four"], "invalid int"),
        (None, ["--loads", "{loads}", "--search", "fast"], "invalid choice"),
        (None, ["--loads", "{loads}", "--out", "{tmp}/no/dir/plan.npy"], "no such directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, loads_file, make, args, words):
    path, _ = loads_file
    if make == "text":
        (tmp_path / "bad.npy").write_text("not numpy")
    elif make == "truncated":
        whole = io.BytesIO()
        np.save(whole, np.ones((4, 16)))
        (tmp_path / "bad.npy").write_bytes(whole.getvalue()[:200])  # header, part of the data
    elif make == "cur_float":
        np.save(tmp_path / "cur.npy", np.zeros((4, 20)))
    elif make == "cur_shape":
        np.save(tmp_path / "cur.npy", np.zeros((4, 19), dtype=np.int64))
    base = {"--gpus": "4", "--slots-per-gpu": "5", "--out": f"{tmp_path}/plan.npy"}
    argv = [a.format(tmp=tmp_path, loads=path) for a in args]
    for flag, value in base.items():
        if flag not in argv:
            argv += [flag, value]
    res = run_plan(*argv)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert words in lines[0]
    assert not (tmp_path / "plan.npy").exists()


def test_groups_keep_each_group_on_one_node(tmp_path, loads_file):
    path, _ = loads_file
    out, report = tmp_path / "plan.npy", tmp_path / "report.json"
    res = run_plan("--loads", path, "--gpus", 4, "--slots-per-gpu", 5, "--nodes", 2,
                   "--groups", 4, "--out", out, "--report", report)
    assert res.returncode == 0, res.stderr
    plan = np.load(out)
    node = np.arange(20) // 10
    for row in plan:
        for g in range(4):
            assert len(set(node[row // 4 == g].tolist())) == 1
    assert json.loads(report.read_text())["groups"] == 4
    bad = run_plan("--loads", path, "--gpus", 4, "--slots-per-gpu", 5, "--groups", 3,
                   "--out", out)
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("--groups: groups = 3 does not divide the 16 experts")

