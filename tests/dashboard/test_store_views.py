"""Store-backed reads of the Plans, Memory and History views on a real SQLite store."""

import time

import numpy as np
import pytest

from harness.simjob import SimJob
from moeplane.controlplane.store import memory_profiles as M
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from moeplane.controlplane.store.queries import Range
from moeplane.controlplane.store.writes import StoreWriter
from moeplane.dashboard.history_queries import device_values_at, range_end_time
from moeplane.dashboard.memory_views import breakdown_figure, decision_rows, memory_summary
from moeplane.dashboard.source import current_placement, placements_at_steps
from moeplane.dashboard.units import GIB, MIB, byte_unit, fmt_bytes


@pytest.fixture
def sim(tmp_path):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    job = SimJob(StoreWriter(engine), nodes=2, devices_per_node=4, layers=3, experts=8)
    job.hello(1_000.0)
    yield engine, job
    engine.dispose()


def shifted(job: SimJob, by: int) -> np.ndarray:
    return (job.identity() + by) % job.experts


def test_current_placement_is_the_newest_applied_plan(sim):
    engine, job = sim
    assert current_placement(engine, job.job_id, (3, 8)).source == "identity"
    first = job.plan(shifted(job, 1))
    job.apply(first, step=10)
    job.plan(shifted(job, 2))  # proposed only: not running
    p = current_placement(engine, job.job_id, (3, 8))
    assert p.source == f"epoch {first}"
    assert np.array_equal(p.phy2log, shifted(job, 1))
    assert (p.geometry.ranks, p.geometry.slots_per_rank) == (8, 1)


def test_a_plan_that_does_not_fit_the_loads_falls_back_to_identity(sim):
    engine, job = sim
    job.apply(job.plan(shifted(job, 1)), step=3)
    assert current_placement(engine, job.job_id, (3, 6)).source == "identity"  # fewer experts
    assert current_placement(engine, job.job_id, (2, 8)).source == "identity"  # fewer layers


def test_placements_at_steps_follow_when_each_plan_was_applied(sim):
    engine, job = sim
    a = job.plan(shifted(job, 1))
    job.apply(a, step=10)
    b = job.plan(shifted(job, 3))
    job.apply(b, step=20)
    got = [p.source for p in placements_at_steps(engine, job.job_id, (3, 8), [5, 10, 19, 20, 30])]
    assert got == ["identity", f"epoch {a}", f"epoch {a}", f"epoch {b}", f"epoch {b}"]


def test_device_values_at_a_past_time(sim):
    engine, job = sim
    hot = {("node-1/gpu2", "temperature_celsius"): 77.0}
    job.samples(1_000.0)
    job.samples(1_010.0, overrides=hot)
    job.samples(1_020.0)
    at = device_values_at(engine, 1_015.0)
    assert len(at) == 8 and {v["ts"] for v in at.values()} == {1_010.0}
    assert at["node-1/gpu2"]["metrics"]["temperature_celsius"] == 77.0
    assert {v["ts"] for v in device_values_at(engine, 1_020.0).values()} == {1_020.0}
    assert device_values_at(engine, 999.0) == {}  # before the first frame
    assert device_values_at(engine, 1_200.0, max_age_s=60) == {}  # nothing that recent
    assert len(device_values_at(engine, 1_015.0, job_id=job.job_id)) == 8
    assert device_values_at(engine, 1_015.0, job_id="another-job") == {}


def test_device_values_at_validation(sim):
    engine, _job = sim
    with pytest.raises(ValueError, match="^at:"):
        device_values_at(engine, float("nan"))
    with pytest.raises(ValueError, match="^max_age_s:"):
        device_values_at(engine, 1.0, max_age_s=0)


def test_range_end_time_of_steps_and_times(sim):
    engine, job = sim
    for step in range(5):
        job.step(step, 2_000.0 + 10 * step)
    assert range_end_time(engine, job.job_id, Range(step_start=1, step_end=3)) == 2_020.0  # steps 1, 2
    assert range_end_time(engine, job.job_id, Range(step_start=3)) == 2_040.0
    assert range_end_time(engine, job.job_id, Range(start=1.0, end=2_025.0)) == pytest.approx(2_025.0)
    assert range_end_time(engine, job.job_id, Range(step_start=50)) is None


def test_memory_breakdown_and_decisions_views(sim):
    engine, job = sim
    job.memory(3_000.0, step=7)
    rows = M.memory_breakdown(engine, job.job_id)
    fig = breakdown_figure(rows)
    params, acts = fig["data"][0], fig["data"][3]
    assert len(params["x"]) == 8 and params["y"][0] == 8.0
    assert acts["y"][0] == 34.0 and acts["y"][1] == 20.0
    assert fig["data"][-1]["name"] == "high watermark" and fig["data"][-1]["y"][0] == pytest.approx(72.0)
    assert memory_summary(rows) == (
        "8 devices profiled · 1 above the high watermark · 0 with offload in effect · 1 with an open decision"
    )
    (row,) = decision_rows(O.list_decisions(engine, job.job_id))
    assert row["actions"] == "swap_activations: layer.3, layer.4"
    assert row["peak"] == "75.0 → 69.0 GiB" and row["measured"] == "–"
    assert row["status"] == "proposed" and row["device"] == "node-0/gpu0"
    assert rows[0]["used_bytes"] == 75 * GIB


def test_sim_job_loads_are_consistent(sim):
    engine, job = sim
    counts = job.step(0, time.time())
    assert counts.shape == (3, 8)


def test_small_devices_are_shown_in_a_unit_that_fits():
    """A CPU rank's few MiB are not "0.0 GiB": figure, rows and text pick MiB (or KiB)."""
    from moeplane.dashboard.cluster_views import _fmt

    assert byte_unit(80 * GIB) == ("GiB", GIB) and byte_unit(None) == ("GiB", GIB)
    assert byte_unit(24 * MIB) == ("MiB", MIB) and byte_unit(512.0) == ("B", 1.0)
    assert fmt_bytes(24 * MIB) == "24.0 MiB" and fmt_bytes(1536.0) == "1.5 KiB"
    row = {"device_id": "node-0/cpu-rank1", "parameters_bytes": 8 * MIB, "gradients_bytes": 0,
           "optimizer_bytes": 0, "activations_peak_bytes": 4 * MIB, "other_bytes": 0,
           "capacity_bytes": 64 * MIB, "high_watermark_bytes": 57.6 * MIB}
    fig = breakdown_figure([row])
    assert fig["layout"]["yaxis"]["title"]["text"] == "MiB" and fig["data"][0]["y"] == [8.0]
    assert "MiB" in fig["layout"]["title"]["text"]
    assert _fmt({"memory_used_bytes": 24 * MIB}, 64 * MIB).startswith("memory 24.0 MiB / 64.0 MiB")
