"""The partial plotly.js bundle served in place of Dash's full one: right version, served at
Dash's URL, and holding every trace type the dashboard's figures use."""

import numpy as np
from plotly.offline import get_plotlyjs_version

from moeplane.controlplane.store.engine import make_engine
from moeplane.dashboard.app import create_dash
from moeplane.dashboard.cluster_views import (
    grid_data,
    grid_figure,
    grid_layout,
    history_figure,
    link_figure,
)
from moeplane.dashboard.expert_views import (
    balancedness_figure,
    expert_heatmap_figure,
    placement_figure,
    rank_load_figure,
    step_time_figure,
)
from moeplane.dashboard.memory_views import breakdown_figure
from moeplane.dashboard.placement import identity_phy2log
from moeplane.dashboard.plan_diff import placement_diff
from moeplane.dashboard.plan_views import diff_figure, timeline_figure
from moeplane.dashboard.plotly_bundle import BUNDLE, PLOTLY_JS, TRACE_TYPES, bundle_version


def test_bundle_is_the_plotly_js_version_plotly_py_ships():
    assert bundle_version() == get_plotlyjs_version()


def test_bundle_is_served_where_dash_loads_plotly(tmp_path):
    client = create_dash(make_engine(f"sqlite:///{tmp_path / 's.sqlite'}")).server.test_client()
    r = client.get("/" + PLOTLY_JS)
    assert r.status_code == 200 and r.mimetype == "text/javascript"
    assert r.data == BUNDLE.read_bytes()
    r.close()


def test_bundle_registers_every_trace_type_the_dashboard_uses():
    text = BUNDLE.read_text(encoding="utf-8")
    for kind in TRACE_TYPES:
        assert f'moduleType:"trace",name:"{kind}"' in text, kind


def test_dashboard_figures_use_only_those_trace_types():
    devices = [{"device_id": f"n{n}/g{d}", "node_id": f"n{n}", "index": d} for n in range(2) for d in range(2)]
    latest = {d["device_id"]: {"metrics": {"utilization_ratio": 0.5, "pcie_tx_bytes_per_second": 1e9}}
              for d in devices}
    layout = grid_layout(devices)
    counts = np.arange(12).reshape(3, 4)
    phy2log = identity_phy2log(3, 4, 2)
    plan = {"epoch": 1, "status": "applied", "created_at": 1.0, "predicted_before": 1.2}
    mem = {"device_id": "n0/g0", "parameters_bytes": 1, "gradients_bytes": 1, "optimizer_bytes": 1,
           "activations_peak_bytes": 1, "other_bytes": 1, "capacity_bytes": 8, "high_watermark_bytes": 7}
    figures = [
        grid_figure(layout, grid_data(layout, latest, "utilization_ratio", {}), "utilization_ratio"),
        link_figure(latest),
        history_figure("n0/g0", [{"ts": 1.0, "value": 0.5}], "utilization_ratio"),
        expert_heatmap_figure(counts, ""),
        rank_load_figure(counts[:, :2], ""),
        balancedness_figure([1, 2], np.ones((2, 3)), ""),
        placement_figure(counts, phy2log, 2, 0),
        step_time_figure([{"step": 1, "step_time_s": 1.0, "host_bound_ratio": 0.1}], ""),
        timeline_figure([plan]),
        diff_figure(placement_diff(phy2log, phy2log, 4, 2), 1, "identity"),
        breakdown_figure([mem]),
    ]
    used = {trace["type"] for fig in figures for trace in fig["data"]}
    assert used <= TRACE_TYPES, used - TRACE_TYPES
