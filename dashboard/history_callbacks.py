"""History page: the cluster grid as it was at the end of the chosen range (from the raw
frames in the store, ``moeplane.dashboard.history_queries``). The load views of the page are in
``expert_callbacks``."""

from __future__ import annotations

from datetime import UTC, datetime

from dash import Input, Output, State
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import queries as q
from moeplane.dashboard.cluster_callbacks import summary_text
from moeplane.dashboard.cluster_views import METRICS, grid_data, grid_figure, grid_layout
from moeplane.dashboard.history_queries import device_values_at, range_end_time
from moeplane.dashboard.ranges import history_range


def _blank(title: str) -> dict:
    return {"data": [], "layout": {"title": {"text": title}, "height": 200,
                                   "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def register(app, engine: Engine) -> None:
    @app.callback(
        Output("history-cluster-grid", "figure"),
        Output("history-cluster-summary", "children"),
        Input("history-apply", "n_clicks"),
        Input("job-select", "value"),
        Input("history-metric", "value"),
        State("history-kind", "value"),
        State("history-from", "value"),
        State("history-to", "value"),
    )
    def cluster_at(_clicks, job_id, metric, kind, start, end):
        if not job_id:
            return _blank(""), "no job has reported yet"
        metric = metric if metric in METRICS else "utilization_ratio"
        try:
            job = q.get_job(engine, job_id)
            rng = history_range(kind or "steps", start, end, job["latest_step"])
            at = range_end_time(engine, job_id, rng)
        except (ValueError, q.NotFound) as exc:
            return _blank(""), f"cannot show the cluster: {exc}"
        if at is None:
            return _blank("no telemetry in that range"), f"job {job_id}: no steps in that range"
        devices = q.list_devices(engine, job_id=job_id)
        values = device_values_at(engine, at, job_id=job_id)
        layout = grid_layout(devices)
        totals = {d["device_id"]: d["memory_total_bytes"] for d in devices}
        fig = grid_figure(layout, grid_data(layout, values, metric, totals), metric)
        when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        fig["layout"]["title"]["text"] += f" at {when}"
        fig["layout"]["uirevision"] = "history-grid"
        return fig, f"as of {when}: " + summary_text(values, totals, len(devices))
