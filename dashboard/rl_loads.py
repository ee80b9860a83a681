"""RL page, expert loads by phase: an MoE policy's loads during rollout beside those during
training (one heatmap layer x expert per phase, each cell the expert's share of its layer's
tokens), and per layer the busiest expert over the mean expert per phase.

Follows the page's step-range picker (the applied range in ``rl-range``, written by
:mod:`moeplane.dashboard.rl_callbacks`): the steps picked, or, while the picker is blank, the
newest ``STEPS`` steps with phase loads (live). Read through
:mod:`moeplane.controlplane.store.rl_loads` (what REST ``/rl/loads`` serves); re-drawn only when
the range or the newest step with loads changes. Element ids: ``rl-loads``, ``rl-loads-balance``.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html, no_update
from plotly.subplots import make_subplots
from sqlalchemy.engine import Engine

from moeplane.controlplane.rl.loads import summarize
from moeplane.controlplane.rl.step_window import step_window
from moeplane.controlplane.store import rl_loads
from moeplane.dashboard.rl_views import PHASE_COLORS

STEPS = 20  # the RL page's blank range (its picker and this section): the newest STEPS steps
MAX_PANELS = 4  # phases drawn side by side (generate and train_update first)
FIRST = ("generate", "train_update")


def _empty(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=260, margin={"l": 60, "r": 10, "t": 40, "b": 40})
    return fig


def _ordered(phases: list[dict]) -> list[dict]:
    """Rollout and training first, then the other phases in PHASES order; at most MAX_PANELS."""
    rank = {name: i for i, name in enumerate(FIRST)}
    return sorted(phases, key=lambda p: rank.get(p["phase"], len(FIRST)))[:MAX_PANELS]


def loads_figure(phases: list[dict], steps: tuple[int, int] | None = None) -> go.Figure:
    """One heatmap per phase (layer x expert): the share of each layer's tokens routed to each
    expert. ``phases``: :func:`moeplane.controlplane.rl.loads.summarize` entries (``share``
    float [L, E]); ``steps``: the [first, last] step summed, for the title."""
    if not phases:
        return _empty("expert loads by phase: none reported (attach_rl(..., watch=attach(model)))")
    shown = _ordered(phases)
    fig = make_subplots(rows=1, cols=len(shown), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{p['phase']} · {p['tokens']:,} routed" for p in shown])
    top = max(float(p["share"].max()) for p in shown) or 1.0
    for i, p in enumerate(shown, start=1):
        layers, experts = p["share"].shape
        fig.add_trace(go.Heatmap(z=p["share"].tolist(), x=list(range(experts)), y=[f"layer {k}" for k in range(layers)],
                                 zmin=0, zmax=top, colorscale="Viridis", name=p["phase"], showscale=i == len(shown),
                                 colorbar={"title": "share"},
                                 hovertemplate=f"{p['phase']}<br>%{{y}} · expert %{{x}}<br>share %{{z:.3f}}"
                                               "<extra></extra>"), row=1, col=i)
        fig.update_xaxes(title_text="expert", row=1, col=i)
    span = f" · steps {steps[0]}–{steps[1]}" if steps else ""
    fig.update_layout(title=f"expert loads during rollout beside training (share of each layer's tokens){span}",
                      height=max(280, 18 * shown[0]["share"].shape[0] + 140),
                      margin={"l": 70, "r": 10, "t": 70, "b": 40})
    return fig


def balance_figure(phases: list[dict]) -> go.Figure:
    """Per layer and phase, the busiest expert's tokens over the mean expert's (1.0: even)."""
    if not phases:
        return _empty("expert imbalance by phase: none reported")
    fig = go.Figure()
    for p in _ordered(phases):
        m = np.asarray(p["max_over_mean"])
        fig.add_bar(x=[f"layer {k}" for k in range(m.size)], y=m.tolist(), marker_color=PHASE_COLORS[p["phase"]],
                    name=f"{p['phase']} (mean {p['max_over_mean_avg']:.2f})")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#999")
    fig.update_layout(title="expert imbalance per layer (max / mean expert load) by phase", barmode="group",
                      height=280, yaxis_title="max / mean", margin={"l": 60, "r": 10, "t": 40, "b": 40})
    return fig


def section() -> html.Div:
    return html.Div([
        dcc.Store(id="rl-loads-shown"),
        dcc.Graph(id="rl-loads", config={"displaylogo": False}),
        dcc.Graph(id="rl-loads-balance", config={"displaylogo": False}),
    ])


def loads_range(applied: dict, newest: int | None) -> tuple[int, int] | None:
    """[lo, hi) of the loads to show: the picker's applied range (``applied``: the ``rl-range``
    data, with ``lo``, ``hi`` and the ``picked`` texts), or, when the picker is blank, the
    newest ``STEPS`` steps up to ``newest`` (the newest step with loads; None: none, no range)."""
    if any((text or "").strip() for text in applied.get("picked") or ()):
        return int(applied["lo"]), int(applied["hi"])
    if newest is None:
        return None
    return step_window(None, None, newest, default=STEPS)


def register(app, engine: Engine) -> None:
    @app.callback(
        Output("rl-loads", "figure"),
        Output("rl-loads-balance", "figure"),
        Output("rl-loads-shown", "data"),
        Input("rl-range", "data"),
        Input("rl-tick", "n_intervals"),
        State("rl-loads-shown", "data"),
    )
    def refresh(applied, _n, shown):
        if not applied:
            return no_update, no_update, no_update
        job_id = applied["job"]
        newest = rl_loads.latest_step(engine, job_id)
        steps = loads_range(applied, newest)
        state = {"job": job_id, "steps": steps, "newest": newest}
        if shown == state:
            return no_update, no_update, no_update
        if steps is None:
            return loads_figure([]), balance_figure([]), state
        lo, hi = steps
        sums = rl_loads.sum_by_phase(engine, job_id, lo, hi)
        phases = summarize(sums.phases, sums.counts)
        return loads_figure(phases, (lo, hi - 1)), balance_figure(phases), state
