"""Cluster page callbacks: the device grid (patched in place on each tick), link throughput,
and a device's history on click."""

from __future__ import annotations

import hashlib

from dash import Input, Output, Patch, State, no_update
from dash.exceptions import PreventUpdate
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import queries as q
from moeplane.dashboard.cluster_views import (
    METRICS,
    alerts_summary,
    grid_data,
    grid_figure,
    grid_layout,
    history_figure,
    link_figure,
)

HISTORY_SECONDS = 900.0


def summary_text(latest: dict, totals: dict, n_devices: int) -> str:
    """The alert summary line of a cluster grid."""
    a = alerts_summary(latest, totals)
    return (
        f"{n_devices} devices, {len(latest)} reporting · "
        f"{a['health_ok']} unhealthy · {a['temperature_celsius']} at ≥ 85 °C · "
        f"{a['memory_used_ratio']} with HBM ≥ 95 % · {a['host_bound_ratio']} host-bound ≥ 30 %"
    )


def register(app, engine: Engine) -> None:
    @app.callback(
        Output("cluster-grid", "figure"),
        Output("cluster-shown", "data"),
        Output("cluster-summary", "children"),
        Output("link-graph", "figure"),
        Output("device-select", "options"),
        Input("cluster-tick", "n_intervals"),
        Input("cluster-metric", "value"),
        State("cluster-shown", "data"),
    )
    def refresh_grid(_n, metric, shown):
        metric = metric if metric in METRICS else "utilization_ratio"
        devices = q.list_devices(engine)
        latest = q.latest_device_values(engine)
        layout = grid_layout(devices)
        key = hashlib.sha1(layout.key.encode()).hexdigest()
        newest = max((d["ts"] for d in latest.values()), default=0.0)
        state = {"key": key, "metric": metric, "ts": newest}
        same_layout = bool(shown) and shown.get("key") == key
        if same_layout and shown == state:
            return no_update, no_update, no_update, no_update, no_update
        totals = {d["device_id"]: d["memory_total_bytes"] for d in devices}
        data = grid_data(layout, latest, metric, totals)
        if same_layout and shown.get("metric") == metric:
            fig = Patch()  # same cells, same metric: only values and hot spots change
            fig["data"][0]["z"] = data.z
            fig["data"][0]["text"] = data.hover
            fig["data"][1]["x"] = data.hot_cols
            fig["data"][1]["y"] = data.hot_rows
        else:
            fig = grid_figure(layout, data, metric)
        options = no_update if same_layout else [d["device_id"] for d in devices]
        return fig, state, summary_text(latest, totals, len(devices)), link_figure(latest), options

    @app.callback(
        Output("device-select", "value"),
        Input("cluster-grid", "clickData"),
        prevent_initial_call=True,
    )
    def pick_device(click):
        if not click or not click.get("points"):
            raise PreventUpdate
        pt = click["points"][0]
        layout = grid_layout(q.list_devices(engine))
        try:
            dev = layout.device_ids[int(pt["y"]), int(pt["x"])]
        except (KeyError, IndexError, TypeError, ValueError):
            raise PreventUpdate from None
        if not dev:
            raise PreventUpdate
        return dev

    @app.callback(
        Output("device-history", "figure"),
        Input("device-select", "value"),
        Input("cluster-tick", "n_intervals"),
        Input("cluster-metric", "value"),
        State("cluster-shown", "data"),
    )
    def device_history(device_id, _n, metric, shown):
        if not device_id:
            return {"data": [], "layout": {"title": {"text": "click a device for its history"},
                                           "height": 200, "xaxis": {"visible": False},
                                           "yaxis": {"visible": False}}}
        metric = metric if metric in METRICS else "utilization_ratio"
        stored = "memory_used_bytes" if metric == "memory_used_ratio" else metric
        newest = (shown or {}).get("ts") or None
        rng = q.Range(start=newest - HISTORY_SECONDS if newest else None, limit=q.MAX_LIMIT)
        try:
            rows = q.device_history(engine, device_id, stored, rng)
        except q.NotFound:
            rows = []
        return history_figure(device_id, rows, stored)
