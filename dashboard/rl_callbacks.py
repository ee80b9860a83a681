"""RL page: layout and callbacks. Reads the newest ``STEPS`` steps of the selected job through
``moeplane.controlplane.store.rl`` (the functions behind REST ``/rl/...``) and re-draws only
when a newer step arrived.

Element ids: ``rl-summary``, ``rl-timeline``, ``rl-steps``, ``rl-heatmap``, ``rl-tail``,
``rl-staleness``, ``rl-sync``.
"""

from __future__ import annotations

from dash import Input, Output, State, dcc, html, no_update
from sqlalchemy.engine import Engine

from moeplane.controlplane.rl import idle
from moeplane.controlplane.store import rl as store_rl
from moeplane.dashboard import rl_loads
from moeplane.dashboard import rl_views as V

STEPS = 20
GRAPHS = ("rl-timeline", "rl-steps", "rl-heatmap", "rl-tail", "rl-staleness", "rl-sync")
_CARD = {"padding": "6px 10px", "margin": "4px 0", "border": "1px solid #ddd", "borderRadius": "4px"}


def page(interval_ms: int) -> html.Div:
    half = {"width": "50%", "display": "inline-block", "verticalAlign": "top"}
    return html.Div([
        dcc.Interval(id="rl-tick", interval=max(interval_ms, 2000)),
        dcc.Store(id="rl-shown"),
        html.Div(id="rl-summary", style=_CARD),
        dcc.Graph(id="rl-timeline", config={"displaylogo": False}),
        dcc.Graph(id="rl-steps", config={"displaylogo": False}),
        dcc.Graph(id="rl-heatmap", config={"displaylogo": False}),
        html.Div([html.Div(dcc.Graph(id="rl-tail"), style=half), html.Div(dcc.Graph(id="rl-staleness"), style=half)]),
        dcc.Graph(id="rl-sync", config={"displaylogo": False}),
        rl_loads.section(),  # expert loads by phase (MoE policies)
    ])


def register(app, engine: Engine) -> None:
    rl_loads.register(app, engine)
    @app.callback(
        *(Output(g, "figure") for g in GRAPHS),
        Output("rl-summary", "children"),
        Output("rl-shown", "data"),
        Input("job-select", "value"),
        Input("rl-tick", "n_intervals"),
        State("rl-shown", "data"),
    )
    def refresh(job_id, _n, shown):
        none = (no_update,) * (len(GRAPHS) + 2)
        if not job_id:
            return *none[:-2], "no job has reported yet", no_update
        newest = store_rl.latest_step(engine, job_id)
        state = {"job": job_id, "newest": newest}
        if shown == state:
            return none
        lo = 0 if newest is None else max(0, int(newest) + 1 - STEPS)
        hi = 1 if newest is None else int(newest) + 1
        spans = store_rl.read_spans(engine, job_id, lo, hi)
        rep = idle.analyze(spans)
        batches = store_rl.read_batches(engine, job_id, lo, hi)
        syncs = store_rl.read_syncs(engine, job_id, lo, hi)
        return (V.timeline_figure(spans), V.step_bars_figure(rep), V.idle_heatmap_figure(rep), V.tail_figure(rep),
                V.staleness_figure(batches), V.sync_figure(syncs), V.summary_text(rep), state)
