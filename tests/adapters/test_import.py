"""``moeplane import`` (a real subprocess) into real PostgreSQL: SGLang dumps and .npy/.npz."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
import sqlalchemy as sa
import torch

from moeplane.controlplane.retention import RetentionPolicy
from moeplane.controlplane.store import history as H
from moeplane.controlplane.store import load_history as LH
from moeplane.controlplane.store import tables as t
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.torch]
STEPS, L, E = 5, 3, 8


def moeplane_import(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moeplane.controlplane.cli.main", "import", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def db(pg_url):
    upgrade(pg_url)
    engine = make_engine(pg_url)
    yield pg_url, engine
    engine.dispose()


def stored(engine, job: str) -> dict[int, np.ndarray]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.expert_loads.c.step, t.expert_loads.c.counts)
                            .where(t.expert_loads.c.job_id == job)).all()
    return {r.step: np.frombuffer(r.counts, dtype="<i8").reshape(L, E) for r in rows}


def test_sglang_dumps_of_two_ranks_sum_per_step_and_reach_the_load_history(db, tmp_path):
    url, engine = db
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=(2, STEPS, L, E))
    for rank in range(2):
        torch.save({"rank": rank, "logical_count": torch.from_numpy(counts[rank]),
                    "last_physical_to_logical_map": torch.arange(E).repeat(L, 1)},
                   tmp_path / f"dump{rank}.pt")
    files = [str(tmp_path / f"dump{r}.pt") for r in range(2)]
    done = moeplane_import(*files, "--job", "sgl", "--start-step", "10", "--database-url", url)
    assert done.returncode == 0, done.stderr
    assert "imported 5 steps of [3, 8] loads from 2 file(s) into job sgl" in done.stdout
    got = stored(engine, "sgl")
    assert sorted(got) == list(range(10, 15))
    for i in range(STEPS):
        np.testing.assert_array_equal(got[10 + i], counts[0, i] + counts[1, i])
    again = moeplane_import(files[0], "--job", "sgl", "--start-step", "10", "--database-url", url)
    assert again.returncode == 0, again.stderr
    assert stored(engine, "sgl")[10].tolist() == got[10].tolist()  # stored once
    now = time.time()
    policy = RetentionPolicy(raw_s=3600.0, loads_s=3600.0, minute_s=0.0, hour_s=0.0, lag_s=0.0)
    win = H.plan_window(now - 600, now + 60, 3600, 10, now, policy)
    items = LH.load_history(engine, "sgl", win)["items"]
    assert sum(item["steps"] for item in items) == STEPS
    np.testing.assert_allclose(np.average([item["values"] for item in items], axis=0,
                                          weights=[item["steps"] for item in items]),
                               (counts[0] + counts[1]).mean(axis=0))


def test_npy_and_npz_arrays_import_as_steps(db, tmp_path):
    url, engine = db
    array = np.arange(STEPS * L * E, dtype=np.int32).reshape(STEPS, L, E)
    np.save(tmp_path / "loads.npy", array)
    np.savez(tmp_path / "loads.npz", loads=array.astype(np.float64) * 2)
    assert moeplane_import(str(tmp_path / "loads.npy"), "--job", "a",
                           "--database-url", url).returncode == 0
    assert moeplane_import(str(tmp_path / "loads.npz"), "--job", "b",
                           "--database-url", url).returncode == 0
    a, b = stored(engine, "a"), stored(engine, "b")
    for step in range(STEPS):
        np.testing.assert_array_equal(a[step], array[step])
        np.testing.assert_array_equal(b[step], array[step] * 2)


def test_bad_and_mismatched_files_exit_2_with_one_line(db, tmp_path):
    url, _ = db
    np.save(tmp_path / "good.npy", np.ones((2, L, E), dtype=np.int64))
    np.save(tmp_path / "wide.npy", np.ones((2, L, E + 1), dtype=np.int64))
    np.save(tmp_path / "flat.npy", np.ones(E, dtype=np.int64))
    np.save(tmp_path / "neg.npy", -np.ones((1, L, E), dtype=np.int64))
    np.save(tmp_path / "frac.npy", np.full((1, L, E), 0.5))
    np.savez(tmp_path / "two.npz", a=np.ones((1, L, E)), b=np.ones((1, L, E)))
    (tmp_path / "text.txt").write_text("not counts\n")
    torch.save({"physical_count": torch.ones(1, L, E)}, tmp_path / "nolog.pt")
    assert moeplane_import(str(tmp_path / "good.npy"), "--job", "j",
                           "--database-url", url).returncode == 0
    cases = {
        ("wide.npy",): r"--job j: job 'j' has experts=8, this spec says 9",
        ("good.npy", "wide.npy"): r"wide\.npy: shape \[2, 3, 9\] differs from .*good\.npy's",
        ("flat.npy",): r"flat\.npy: shape \[8\], expected \[steps, layers, experts\]",
        ("neg.npy",): r"neg\.npy: negative counts",
        ("frac.npy",): r"frac\.npy: counts are not whole numbers",
        ("two.npz",): r"two\.npz: 2 arrays \(a, b\); pick one with --key",
        ("text.txt",): r"text\.txt: neither \.npy/\.npz nor a torch\.save dump",
        ("nolog.pt",): r"nolog\.pt: an SGLang dump is a dict with logical_count; got keys "
                       r"\['physical_count'\]",
        ("missing.npy",): r"missing\.npy: no such file",
    }
    for names, pattern in cases.items():
        done = moeplane_import(*(str(tmp_path / n) for n in names), "--job", "j",
                               "--database-url", url)
        assert done.returncode == 2, (names, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("moeplane import: error: "), done.stderr
        assert re.search(pattern, lines[0]), (pattern, lines[0])
