import math

import numpy as np
import pytest

from moeplane.dashboard.cluster_views import (
    GIB,
    METRICS,
    alert_mask,
    alerts_summary,
    grid_data,
    grid_figure,
    grid_layout,
    link_figure,
    metric_value,
    natural_key,
)
from moeplane.dashboard.expert_views import (
    balancedness_figure,
    expert_heatmap_figure,
    placement_figure,
    rank_load_figure,
    relative_rank_load,
    step_time_figure,
)
from moeplane.dashboard.placement import identity_phy2log


def devices(nodes: int, per_node: int) -> list[dict]:
    return [
        {"device_id": f"node-{n}/gpu{d}", "node_id": f"node-{n}", "index": d}
        for n in range(nodes)
        for d in range(per_node)
    ]


def test_grid_layout_places_every_device_once_in_natural_node_order():
    lay = grid_layout(devices(12, 8), per_row=4)
    assert lay.device_ids.shape == (3, 4 * 9 - 1)
    assert len(lay.positions) == 96
    assert lay.positions["node-0/gpu0"] == (0, 0)
    assert lay.positions["node-1/gpu3"] == (0, 9 + 3)  # a blank column separates nodes
    assert lay.positions["node-10/gpu7"] == (2, 2 * 9 + 7)  # node-10 after node-9, not node-1
    assert lay.device_ids[0, 8] == ""
    assert lay.row_labels[2] == "node-8 · node-9 · node-10 · node-11"


def test_grid_at_1024_devices_stays_compact():
    lay = grid_layout(devices(128, 8))
    rows, cols = lay.device_ids.shape
    assert len(lay.positions) == 1024
    assert rows <= 32 and cols <= 64  # every cell stays a readable size on one screen


def test_natural_key_orders_numbers_numerically():
    assert sorted(["node-10", "node-2", "node-1"], key=natural_key) == ["node-1", "node-2", "node-10"]


def test_memory_ratio_uses_device_total_when_sample_lacks_it():
    assert metric_value({"memory_used_bytes": 40 * GIB}, "memory_used_ratio", 80 * GIB) == 0.5
    assert math.isnan(metric_value({}, "memory_used_ratio", 80 * GIB))
    assert math.isnan(metric_value({"memory_used_bytes": 1.0}, "memory_used_ratio", None))


def test_alert_rules():
    t = np.array([50.0, 85.0, 90.0, np.nan])
    assert alert_mask("temperature_celsius", t).tolist() == [False, True, True, False]
    assert alert_mask("health_ok", np.array([1.0, 0.0])).tolist() == [False, True]
    power = np.array([400.0, 410.0, 395.0, 405.0, 1500.0])
    assert alert_mask("power_watts", power).tolist() == [False] * 4 + [True]
    assert not alert_mask("power_watts", np.full(5, 400.0)).any()


def test_grid_data_values_units_and_hot_spots():
    devs = devices(2, 2)
    lay = grid_layout(devs, per_row=1)
    latest = {
        "node-0/gpu0": {"metrics": {"temperature_celsius": 60.0, "utilization_ratio": 0.5}},
        "node-1/gpu1": {"metrics": {"temperature_celsius": 95.0}},
    }
    d = grid_data(lay, latest, "temperature_celsius", {})
    assert d.z == [[60.0, None], [None, 95.0]]
    assert (d.hot_rows, d.hot_cols) == ([1], [1])
    assert "node-0/gpu0" in d.hover[0][0] and "util 50 %" in d.hover[0][0]
    assert grid_data(lay, latest, "utilization_ratio", {}).z[0][0] == 50.0  # percent
    fig = grid_figure(lay, d, "temperature_celsius")
    assert fig["data"][0]["z"] is d.z and fig["data"][1]["x"] == [1]
    with pytest.raises(ValueError, match="metric"):
        grid_data(lay, latest, "nope", {})


def test_alerts_summary_and_link_figure():
    latest = {
        "a": {"metrics": {"health_ok": 0.0, "temperature_celsius": 90.0, "pcie_tx_bytes_per_second": 2e9}},
        "b": {"metrics": {"health_ok": 1.0, "host_bound_ratio": 0.5, "memory_used_bytes": 79 * GIB}},
    }
    s = alerts_summary(latest, {"b": 80 * GIB})
    assert s == {"health_ok": 1, "temperature_celsius": 1, "memory_used_ratio": 1, "host_bound_ratio": 1}
    fig = link_figure(latest)
    assert [t["name"] for t in fig["data"]] == ["PCIe TX"] and fig["data"][0]["y"] == [2.0]


def test_every_grid_metric_has_a_unit():
    assert all(m.unit and m.label for m in METRICS.values())


def test_expert_figures_carry_the_arrays():
    counts = np.arange(12).reshape(3, 4)
    assert expert_heatmap_figure(counts, "t")["data"][0]["z"] == counts.tolist()
    with pytest.raises(ValueError, match="counts"):
        expert_heatmap_figure(np.zeros(3), "t")
    per_rank = np.array([[2.0, 6.0], [0.0, 0.0]])
    assert relative_rank_load(per_rank).tolist() == [[0.5, 1.5], [1.0, 1.0]]
    rf = rank_load_figure(per_rank, "r")
    assert rf["data"][0]["z"] == [[0.5, 1.5], [1.0, 1.0]] and rf["data"][0]["zmax"] == 1.5
    bf = balancedness_figure([7, 8], np.array([[1.0, 3.0], [1.0, 1.0]]), "b")
    assert bf["data"][0]["y"] == [2.0, 1.0] and bf["data"][1]["z"] == [[1.0, 1.0], [3.0, 1.0]]


def test_placement_figure_marks_replicas():
    counts = np.array([[10, 4, 6]])
    fig = placement_figure(counts, identity_phy2log(1, 3, 2), 2, 0)  # 4 slots: 0 1 | 2 0
    assert fig["data"][0]["text"] == [["0*", "1"], ["2", "0*"]]
    assert fig["data"][0]["z"] == [[5.0, 4.0], [6.0, 5.0]]
    with pytest.raises(ValueError, match="layer"):
        placement_figure(counts, identity_phy2log(1, 3, 2), 2, 1)


def test_step_time_figure_aggregates_ranks_per_step():
    rows = [
        {"step": 1, "step_time_s": 1.0, "host_bound_ratio": 0.1},
        {"step": 1, "step_time_s": 3.0, "host_bound_ratio": 0.3},
        {"step": 2, "step_time_s": 2.0, "host_bound_ratio": 0.0},
    ]
    fig = step_time_figure(rows, "s")
    assert fig["data"][0]["y"] == [2.0, 2.0] and fig["data"][1]["y"] == [3.0, 2.0]
    assert fig["data"][2]["y"] == pytest.approx([20.0, 0.0])


def test_placement_figure_at_1024_ranks_avoids_per_rank_ticks_and_labels():
    # Thousands of tick labels or cell labels cost seconds of layout in the browser.
    counts = np.ones((2, 256), dtype=np.int64)
    fig = placement_figure(counts, identity_phy2log(2, 256, 1024), 1024, 1)
    assert fig["layout"]["yaxis"]["dtick"] is None and fig["data"][0]["texttemplate"] is None
    assert fig["layout"]["height"] <= 720
