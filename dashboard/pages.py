"""Page layouts (components only, no data): the shell, Cluster, Experts, Plans, Memory and
History.

Stable element ids used by callbacks and browser tests: ``job-select``, ``cluster-grid``,
``expert-heatmap``, ``rank-load``, ``balancedness-graph`` (plus the others named below).
Each live page carries its own ``dcc.Interval`` so only the visible page refreshes.
"""

from __future__ import annotations

from dash import dcc, html

from moeplane.dashboard.cluster_views import METRICS

PAGES = (("cluster", "Cluster"), ("experts", "Experts"), ("plans", "Plans"), ("memory", "Memory"),
         ("history", "History"), ("rl", "RL"))

_CARD = {"padding": "6px 10px", "margin": "4px 0", "border": "1px solid #ddd", "borderRadius": "4px"}


def shell(prefix: str) -> html.Div:
    """The frame around every page: navigation, the job selector, the page slot."""
    nav = [
        dcc.Link(label, href=f"{prefix}{slug}", id=f"nav-{slug}", style={"marginRight": "16px"})
        for slug, label in PAGES
    ]
    return html.Div(
        [
            dcc.Location(id="url"),
            html.Div(
                [
                    html.B("moeplane", style={"marginRight": "24px"}),
                    *nav,
                    html.Span("job:", style={"marginLeft": "24px", "marginRight": "6px"}),
                    dcc.Dropdown(
                        id="job-select",
                        clearable=False,
                        persistence=True,
                        persistence_type="session",
                        style={"width": "260px", "display": "inline-block", "verticalAlign": "middle"},
                    ),
                ],
                style={"display": "flex", "alignItems": "center", "padding": "6px 10px",
                       "borderBottom": "1px solid #ccc", "fontFamily": "sans-serif"},
            ),
            dcc.Interval(id="jobs-tick", interval=5000),
            html.Div(id="page", style={"fontFamily": "sans-serif", "padding": "0 10px"}),
        ]
    )


def cluster_page(interval_ms: int) -> html.Div:
    return html.Div(
        [
            dcc.Interval(id="cluster-tick", interval=interval_ms),
            dcc.Store(id="cluster-shown"),
            html.Div(
                [
                    html.Span("metric: "),
                    dcc.RadioItems(
                        id="cluster-metric",
                        options=[{"label": m.label, "value": k} for k, m in METRICS.items()],
                        value="utilization_ratio",
                        inline=True,
                        persistence=True,
                        persistence_type="session",
                        inputStyle={"marginLeft": "10px", "marginRight": "3px"},
                    ),
                ],
                style=_CARD,
            ),
            html.Div(id="cluster-summary", style=_CARD),
            dcc.Graph(id="cluster-grid", config={"displaylogo": False}),
            html.Div(
                [
                    html.Span("device: "),
                    dcc.Dropdown(id="device-select", style={"width": "260px", "display": "inline-block",
                                                            "verticalAlign": "middle"}),
                    html.Span(" (or click a cell)", style={"color": "#777"}),
                ],
                style=_CARD,
            ),
            dcc.Graph(id="device-history", config={"displaylogo": False}),
            dcc.Graph(id="link-graph", config={"displaylogo": False}),
        ]
    )


def experts_page(interval_ms: int) -> html.Div:
    return html.Div(
        [
            dcc.Interval(id="experts-tick", interval=interval_ms),
            dcc.Store(id="experts-shown"),
            html.Div(id="experts-status", style=_CARD),
            html.Div(
                [
                    html.Div(dcc.Graph(id="expert-heatmap"), style={"flex": "3"}),
                    html.Div(dcc.Graph(id="rank-load"), style={"flex": "2"}),
                ],
                style={"display": "flex"},
            ),
            dcc.Graph(id="balancedness-graph"),
            html.Div(
                [
                    html.Span("placement of layer: "),
                    dcc.Input(id="placement-layer", type="number", min=0, step=1, value=0,
                              debounce=True, style={"width": "80px"}),
                    html.Span(" (the running placement: the newest applied plan; identity, slot s "
                              "holding expert s % E, before the first)",
                              id="placement-source", style={"color": "#777"}),
                ],
                style=_CARD,
            ),
            dcc.Graph(id="placement-graph"),
        ]
    )


def plans_page(interval_ms: int) -> html.Div:
    return html.Div(
        [
            dcc.Interval(id="plans-tick", interval=interval_ms),
            dcc.Store(id="plans-shown"),
            dcc.Store(id="plan-acted", data=0),
            html.Div(id="plans-status", style=_CARD),
            dcc.Graph(id="plans-timeline", config={"displaylogo": False}),
            html.Div(id="plan-action-result", style=_CARD | {"color": "#555"}),
            html.Div(id="plans-table", style=_CARD | {"maxHeight": "360px", "overflowY": "auto"}),
            html.Div(
                [
                    html.Span("diff of plan: "),
                    dcc.Dropdown(id="plan-select", clearable=False,
                                 style={"width": "260px", "display": "inline-block", "verticalAlign": "middle"}),
                    html.Span(" against the running placement", style={"color": "#777"}),
                ],
                style=_CARD,
            ),
            html.Div(id="plan-diff-summary", style=_CARD),
            dcc.Graph(id="plan-diff-graph", config={"displaylogo": False}),
            html.Div(id="plan-diff-slots", style=_CARD | {"maxHeight": "320px", "overflowY": "auto"}),
        ]
    )


def memory_page(interval_ms: int) -> html.Div:
    return html.Div(
        [
            dcc.Interval(id="memory-tick", interval=interval_ms),
            dcc.Store(id="memory-shown"),
            html.Div(id="memory-status", style=_CARD),
            dcc.Graph(id="memory-breakdown", config={"displaylogo": False}),
            html.H4("Offload decisions (newest first)", style={"margin": "8px 0 2px"}),
            html.Div(id="offload-table", style=_CARD | {"maxHeight": "420px", "overflowY": "auto"}),
        ]
    )


def history_page() -> html.Div:
    return html.Div(
        [
            html.Div(
                [
                    dcc.RadioItems(
                        id="history-kind",
                        options=[{"label": "steps", "value": "steps"},
                                 {"label": "time (UTC, ISO 8601)", "value": "time"}],
                        value="steps",
                        inline=True,
                        inputStyle={"marginLeft": "10px", "marginRight": "3px"},
                    ),
                    html.Span(" from "),
                    dcc.Input(id="history-from", type="text", placeholder="first step / time",
                              style={"width": "200px"}),
                    html.Span(" to "),
                    dcc.Input(id="history-to", type="text", placeholder="last step / time",
                              style={"width": "200px"}),
                    html.Button("Show", id="history-apply", n_clicks=0, style={"marginLeft": "10px"}),
                ],
                style=_CARD,
            ),
            html.Div(id="history-status", style=_CARD),
            html.Div(
                [
                    html.Div(dcc.Graph(id="history-heatmap"), style={"flex": "3"}),
                    html.Div(dcc.Graph(id="history-rank-load"), style={"flex": "2"}),
                ],
                style={"display": "flex"},
            ),
            dcc.Graph(id="history-balancedness"),
            dcc.Graph(id="history-steptime"),
            html.Div(
                [
                    html.Span("cluster at the end of the range, metric: "),
                    dcc.RadioItems(
                        id="history-metric",
                        options=[{"label": m.label, "value": k} for k, m in METRICS.items()],
                        value="utilization_ratio",
                        inline=True,
                        inputStyle={"marginLeft": "10px", "marginRight": "3px"},
                    ),
                ],
                style=_CARD,
            ),
            html.Div(id="history-cluster-summary", style=_CARD),
            dcc.Graph(id="history-cluster-grid", config={"displaylogo": False}),
        ]
    )
