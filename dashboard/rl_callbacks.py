"""RL page: layout and callbacks. A step-range picker (blank: the newest ``STEPS`` steps, live)
chooses the steps [lo, hi) that the timeline, the per-step bars, the idle heatmap, the tail,
staleness and weight-sync figures and the Perfetto / Chrome-trace link (``TRACE_PATH``, served by
the dashboard so that its login covers it; the same JSON as REST ``/rl/trace``) show, read through
``moeplane.controlplane.store`` (what REST ``/rl/...`` serves); figures are re-drawn only when
the range or the newest step in it changes.

The timeline draws one bar per span up to ``GANTT_MAX_SPANS`` spans; above that, one cell per
device and step from the per-step phase seconds kept at ingest
(``moeplane.controlplane.store.rl_steps``), without reading a span. The idle analysis covers the newest steps of the range holding at most
``ANALYSIS_MAX_SPANS`` spans, and says so when that is not the whole range.

Element ids: ``rl-from``, ``rl-to``, ``rl-apply``, ``rl-range-status``, ``rl-trace-link``,
``rl-summary``, ``rl-timeline``, ``rl-steps``, ``rl-heatmap``, ``rl-tail``, ``rl-staleness``,
``rl-sync``.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import flask
import numpy as np
from dash import Input, Output, State, dcc, html, no_update
from sqlalchemy.engine import Engine

from moeplane.controlplane.rl import idle
from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl.step_window import newest_within, step_window
from moeplane.controlplane.rl.trace import chrome_trace
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store import rl as store_rl
from moeplane.controlplane.store import rl_steps
from moeplane.dashboard import rl_loads
from moeplane.dashboard import rl_views as V
from moeplane.dashboard.rl_loads import STEPS  # the newest steps shown while the picker is blank

GANTT_MAX_SPANS = 20_000  # above this many spans in the range, the timeline is one cell per device and step
ANALYSIS_MAX_SPANS = 100_000
ANALYSIS = ("rl-steps", "rl-heatmap", "rl-tail", "rl-staleness", "rl-sync")
_CARD = {"padding": "6px 10px", "margin": "4px 0", "border": "1px solid #ddd", "borderRadius": "4px"}


def page(interval_ms: int) -> html.Div:
    half = {"width": "50%", "display": "inline-block", "verticalAlign": "top"}
    picker = html.Div([
        html.Span("steps from "),
        dcc.Input(id="rl-from", type="text", placeholder="first step", style={"width": "110px"}),
        html.Span(" to "),
        dcc.Input(id="rl-to", type="text", placeholder="last step", style={"width": "110px"}),
        html.Button("Show", id="rl-apply", n_clicks=0, style={"marginLeft": "10px"}),
        html.Span(f" (blank: the newest {STEPS} steps, live) · "),
        html.A("Perfetto / Chrome trace of these steps", id="rl-trace-link", href="", target="_blank"),
    ], style=_CARD)
    return html.Div([
        dcc.Interval(id="rl-tick", interval=max(interval_ms, 2000)),
        dcc.Store(id="rl-range"),
        dcc.Store(id="rl-applied-clicks", data=0),
        picker,
        html.Div(id="rl-range-status", style=_CARD),
        html.Div(id="rl-summary", style=_CARD),
        dcc.Graph(id="rl-timeline", config={"displaylogo": False}),
        dcc.Graph(id="rl-steps", config={"displaylogo": False}),
        dcc.Graph(id="rl-heatmap", config={"displaylogo": False}),
        html.Div([html.Div(dcc.Graph(id="rl-tail"), style=half), html.Div(dcc.Graph(id="rl-staleness"), style=half)]),
        dcc.Graph(id="rl-sync", config={"displaylogo": False}),
        rl_loads.section(),  # expert loads by phase (MoE policies)
    ])


def _step(text: str | None, name: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}: not a step number (0, 1, 2, ...): {text!r}")
    return int(text)


def picked_range(start: str | None, end: str | None, newest: int | None) -> tuple[int, int]:
    """[lo, hi) from the picker's inclusive ``from``/``to`` texts (blank: the newest ``STEPS``
    steps); ValueError naming the bad input."""
    first, last = _step(start, "from"), _step(end, "to")
    if first is not None and last is not None and last < first:
        raise ValueError(f"to: step {last} is before from {first}")
    return step_window(first, None if last is None else last + 1, newest, default=STEPS)


def timeline(engine: Engine, job_id: str, lo: int, hi: int):
    """The timeline figure of steps [lo, hi): a Gantt, or device x step above ``GANTT_MAX_SPANS``."""
    return _timeline(engine, job_id, lo, hi)[0]


def _timeline(engine: Engine, job_id: str, lo: int, hi: int):
    """(the timeline figure of steps [lo, hi), (steps int64 [S] ascending, spans int64 [S]: each
    step's span count, from the per-step phase seconds), the range's spans read for the Gantt or
    None above ``GANTT_MAX_SPANS``)."""
    steps, records = rl_steps.read(engine, job_id, lo, hi)
    per_step, first = np.unique(steps, return_index=True)
    counts = np.add.reduceat(records["spans"].astype(np.int64), first) if first.size else np.zeros(0, np.int64)
    if int(counts.sum()) <= GANTT_MAX_SPANS:
        spans = store_rl.read_spans(engine, job_id, lo, hi)
        return V.timeline_figure(spans), (per_step, counts), spans
    return V.step_grid_figure(sp.grid(steps, records)), (per_step, counts), None


TRACE_PATH = "rl-trace"  # served by the dashboard itself, behind its login like the page
TRACE_MAX_SPANS = 1_000_000


def trace_href(job_id: str, lo: int, hi: int) -> str:
    """The page-relative link to the Chrome-trace / Perfetto JSON of steps [lo, hi)."""
    return f"{TRACE_PATH}?job={quote(job_id, safe='')}&step_start={lo}&step_end={hi}"


def trace_response(engine: Engine, args) -> tuple[str, int, dict]:
    """(body, status, headers) for ``TRACE_PATH`` with ``job``, ``step_start``, ``step_end``:
    the trace as a JSON attachment, or 400/404 naming what is wrong."""
    text = {"Content-Type": "text/plain; charset=utf-8"}
    job_id = args.get("job") or ""
    try:
        lo, hi = (int(args.get(k, "")) for k in ("step_start", "step_end"))
        lo, hi = step_window(lo, hi, None)
    except ValueError as exc:
        return f"bad step range: {exc}", 400, text
    try:
        q.require_job(engine, job_id)
    except q.NotFound:
        return f"job: unknown job {job_id!r}", 404, text
    trace = chrome_trace(store_rl.read_spans(engine, job_id, lo, hi, limit=TRACE_MAX_SPANS), job_id)
    name = f"{job_id}-steps-{lo}-{hi - 1}.trace.json".replace("/", "_").replace('"', "_")
    return json.dumps(trace), 200, {"Content-Type": "application/json",
                                    "Content-Disposition": f'attachment; filename="{name}"'}


def register(app, engine: Engine) -> None:
    rl_loads.register(app, engine)
    app.server.add_url_rule("/" + TRACE_PATH, "moeplane_rl_trace",
                            lambda: trace_response(engine, flask.request.args))

    @app.callback(
        Output("rl-range", "data"),
        Output("rl-range-status", "children"),
        Output("rl-trace-link", "href"),
        Output("rl-applied-clicks", "data"),
        Input("rl-apply", "n_clicks"),
        Input("job-select", "value"),
        Input("rl-tick", "n_intervals"),
        State("rl-from", "value"),
        State("rl-to", "value"),
        State("rl-range", "data"),
        State("rl-applied-clicks", "data"),
    )
    def pick(clicks, job_id, _n, start, end, shown, applied):
        if not job_id:
            return no_update, "no job has reported yet", "", no_update
        # a click not applied yet takes the typed inputs, whatever triggered this call: a tick
        # requested while the click's own call is in flight supersedes it and must not drop it;
        # otherwise (the tick or a new job alone) the inputs last applied, not half-typed ones
        clicked = (clicks or 0) != (applied or 0)
        if not clicked:
            start, end = (shown or {}).get("picked", (None, None))
        newest = store_rl.latest_step(engine, job_id)
        try:
            lo, hi = picked_range(start, end, newest)
        except ValueError as exc:
            return no_update, f"bad step range: {exc}", no_update, clicks
        live = newest is not None and newest >= lo
        state = {"job": job_id, "lo": lo, "hi": hi, "newest": min(newest, hi - 1) if live else None,
                 "picked": [start, end]}
        if state == shown and not clicked:
            return no_update, no_update, no_update, no_update
        follow = " (the newest, live)" if not (start or "").strip() and not (end or "").strip() else ""
        return (no_update if state == shown else state), f"steps {lo}–{hi - 1}{follow}", \
            trace_href(job_id, lo, hi), clicks

    @app.callback(Output("rl-timeline", "figure"), *(Output(g, "figure") for g in ANALYSIS),
                  Output("rl-summary", "children"), Input("rl-range", "data"))
    def draw(shown):
        if not shown:
            return (no_update,) * (len(ANALYSIS) + 2)
        job_id, lo, hi = shown["job"], shown["lo"], shown["hi"]
        fig, (steps, counts), spans = _timeline(engine, job_id, lo, hi)
        first = newest_within(steps, counts, ANALYSIS_MAX_SPANS)
        cut = first is not None and first > int(steps[0])
        if cut or spans is None:  # the Gantt's spans are the whole range's: analysed as they are
            spans = store_rl.read_spans(engine, job_id, first if cut else lo, hi)
        rep = idle.analyze(spans)
        batches = store_rl.read_batches(engine, job_id, lo, hi)
        syncs = store_rl.read_syncs(engine, job_id, lo, hi)
        note = (f" · idle analysis of steps {first}–{hi - 1} only: the range holds {int(counts.sum()):,} spans, "
                f"at most {ANALYSIS_MAX_SPANS:,} are analysed") if cut else ""
        return (fig, V.step_bars_figure(rep), V.idle_heatmap_figure(rep), V.tail_figure(rep),
                V.staleness_figure(batches), V.sync_figure(syncs), V.summary_text(rep) + note)
