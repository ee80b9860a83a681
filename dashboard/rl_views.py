"""RL page figures, from span columns, the idle report, syncs and batches (no I/O).

Times on the timeline are seconds from the first span shown; device-seconds elsewhere.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from moeplane.controlplane.rl import idle
from moeplane.controlplane.rl import step_phases as sp
from moeplane.controlplane.rl.phases import PHASES, ROLES, Spans

PHASE_COLORS = dict(zip(PHASES, (
    "#1f77b4", "#17becf", "#9467bd", "#c5b0d5", "#8c564b", "#e377c2", "#2ca02c",
    "#d62728", "#ff7f0e", "#ffbb78", "#bbbbbb", "#7f7f7f", "#bcbd22"), strict=True))
CAUSE_COLORS = dict(zip(idle.CAUSES, ("#fdd0a2", "#fdae6b", "#f16913", "#d94801", "#a63603", "#dddddd"),
                        strict=True))


def _empty(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=260, margin={"l": 60, "r": 10, "t": 40, "b": 40})
    return fig


def device_label(role: int, rank: int) -> str:
    """A timeline row: ``"<role> · rank <k>"``, or ``"<role> · job"`` for rank -1 (a framework's
    per-step timers)."""
    return f"{ROLES[role]} · rank {rank}" if rank >= 0 else f"{ROLES[role]} · job"


def device_rows(labels) -> list[str]:
    """Distinct row labels, top to bottom: grouped by role name, then by rank (job row first)."""
    return sorted(set(labels), key=lambda s: (s.split(" · ")[0], int(s.rsplit(" ", 1)[1]) if s[-1].isdigit() else -1))


def timeline_figure(spans: Spans) -> go.Figure:
    """Gantt: one row per device (grouped by role), one bar per span coloured by phase; dotted
    lines at step starts, labelled with the step and the policy version."""
    if len(spans) == 0:
        return _empty("timeline: no spans")
    t0 = float(spans.start.min())
    label = np.array([device_label(r, k) for r, k in zip(spans.role.tolist(), spans.rank.tolist(), strict=True)],
                     dtype=object)
    rows = device_rows(label.tolist())
    fig = go.Figure()
    for code in sorted(set(spans.phase.tolist())):
        m = spans.phase == code
        name = PHASES[code]
        fig.add_bar(y=label[m], x=spans.end[m] - spans.start[m], base=spans.start[m] - t0, orientation="h",
                    name=name, marker_color=PHASE_COLORS[name],
                    customdata=np.stack([spans.step[m], spans.version[m]], axis=1),
                    hovertemplate=f"{name}<br>step %{{customdata[0]}} · version %{{customdata[1]}}"
                                  "<br>%{base:.2f}s + %{x:.2f}s<extra>%{y}</extra>")
    steps = np.unique(spans.step)
    order = np.lexsort((spans.start, spans.step))  # per step: its earliest span, and its lowest version
    step_start = np.minimum.reduceat(spans.start[order], np.searchsorted(spans.step[order], steps)) - t0
    step_version = np.minimum.reduceat(spans.version[order], np.searchsorted(spans.step[order], steps))
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
               "line": {"dash": "dot", "color": "#999"}} for x in step_start.tolist()]
    notes = [{"x": x, "y": 1.02, "yref": "paper", "showarrow": False, "font": {"size": 10}, "text": f"s{s} v{v}"}
             for x, s, v in zip(step_start.tolist(), steps.tolist(), step_version.tolist(), strict=True)]
    fig.update_layout(shapes=shapes, annotations=notes)
    fig.update_layout(title="timeline (colour: phase)", barmode="overlay", height=max(260, 22 * len(rows) + 90),
                      xaxis_title="seconds", yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
                      margin={"l": 130, "r": 10, "t": 50, "b": 40})
    return fig


def step_grid_figure(g: sp.StepGrid) -> go.Figure:
    """The timeline of a range too large for one bar per span: one row per device of ``g``
    (labelled by :func:`device_label`), one cell per step of ``g``,
    coloured by the phase with the most seconds in the step, white where the device has no span
    in it; hover: that phase's seconds and the device's idle seconds (the step's wall minus its
    phase seconds). Sent as int8 codes [D, S] and float32 [D, S, 2] to keep the figure small."""
    if g.steps.size == 0:
        return _empty("timeline: no spans")
    labels = [device_label(r, k) for r, k in zip(g.roles.tolist(), g.ranks.tolist(), strict=True)]
    top, top_s = g.dominant()  # [S, D]
    order = [labels.index(r) for r in device_rows(labels)][::-1]  # plotly draws row 0 at the bottom
    hover = np.stack([top_s[:, order].T, g.idle()[:, order].T], axis=2).astype(np.float32)
    names = ("no span", *PHASES)
    colors = ("#ffffff", *(PHASE_COLORS[p] for p in PHASES))
    n = len(names)
    scale = [x for i, c in enumerate(colors) for x in ((i / n, c), ((i + 1) / n, c))]
    fig = go.Figure(go.Heatmap(
        z=top[:, order].T, x=g.steps, y=[labels[i] for i in order], customdata=hover, zmin=-1.5, zmax=n - 1.5,
        colorscale=scale, colorbar={"title": "phase", "tickvals": list(range(-1, n - 1)), "ticktext": list(names)},
        hovertemplate="%{y} · step %{x}<br>phase #%{z} (colour bar): %{customdata[0]:.2f} s"
                      "<br>idle %{customdata[1]:.2f} s<extra></extra>"))
    fig.update_layout(title=f"timeline per step: {g.steps.size:,} steps, {g.spans:,} spans (colour: the phase with "
                            "the most time in the step); pick a shorter range for one bar per span",
                      height=max(260, min(4 * len(labels), 900) + 90), xaxis_title="step",
                      margin={"l": 130, "r": 10, "t": 50, "b": 40})
    return fig


def step_bars_figure(rep: idle.IdleReport) -> go.Figure:
    """Device-seconds per step: productive, sync, switch, then idle by cause (stacked)."""
    if rep.steps.size == 0:
        return _empty("time per step: no spans")
    x = rep.steps.tolist()
    fig = go.Figure()
    for name, values, color in (("productive", rep.productive, "#2ca02c"), ("weight sync", rep.sync, "#d62728"),
                                ("offload/onload", rep.switch, "#ff7f0e")):
        fig.add_bar(x=x, y=values.sum(axis=1).tolist(), name=name, marker_color=color)
    for i, cause in enumerate(idle.CAUSES):
        fig.add_bar(x=x, y=rep.idle_cause[:, :, i].sum(axis=1).tolist(), name=f"idle: {cause}",
                    marker_color=CAUSE_COLORS[cause])
    fig.update_layout(title="device-seconds per step", barmode="stack", height=300, xaxis_title="step",
                      margin={"l": 60, "r": 10, "t": 40, "b": 40})
    return fig


def idle_heatmap_figure(rep: idle.IdleReport) -> go.Figure:
    """Idle share of each device's step (device x step)."""
    if rep.steps.size == 0:
        return _empty("idle: no spans")
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(rep.present, rep.idle / rep.wall[:, None], np.nan)
    fig = go.Figure(go.Heatmap(z=share.T, x=rep.steps.tolist(), y=[f"rank {r}" for r in rep.ranks.tolist()],
                               zmin=0, zmax=1, colorscale="Oranges", colorbar={"title": "idle"}))
    fig.update_layout(title="idle share (device x step)", height=max(260, 16 * rep.ranks.size + 90),
                      xaxis_title="step", margin={"l": 70, "r": 10, "t": 40, "b": 40})
    return fig


def tail_figure(rep: idle.IdleReport) -> go.Figure:
    """Generation time per step over devices: p50, p99 and max."""
    fig = _empty("generation long tail")
    if rep.steps.size == 0:
        return fig
    stats = {"p50": [], "p99": [], "max": []}
    for row in rep.generate:
        g = row[row > 0]
        for k, v in (("p50", 50), ("p99", 99), ("max", 100)):
            stats[k].append(float(np.percentile(g, v)) if g.size else None)
    for k, values in stats.items():
        fig.add_scatter(x=rep.steps.tolist(), y=values, name=k, mode="lines+markers")
    fig.update_layout(yaxis_title="seconds", xaxis_title="step")
    return fig


def staleness_figure(batches: list[dict]) -> go.Figure:
    """Sample lag per step (mean, max) against the bound, and its histogram."""
    fig = _empty("staleness (policy versions behind)")
    if not batches:
        return fig
    steps = [b["step"] for b in batches]
    fig.add_scatter(x=steps, y=[b["lag_mean"] for b in batches], name="lag mean", mode="lines+markers")
    fig.add_scatter(x=steps, y=[b["lag_max"] for b in batches], name="lag max", mode="lines+markers")
    bounds = [b["bound"] if b["bound"] >= 0 else None for b in batches]
    if any(b is not None for b in bounds):
        fig.add_scatter(x=steps, y=bounds, name="bound", mode="lines", line={"dash": "dash", "color": "#d62728"})
    fig.add_histogram(x=[b["lag_max"] for b in batches], name="lag max (histogram)", xaxis="x2", yaxis="y2",
                      marker_color="#bbbbbb")
    fig.update_layout(xaxis={"domain": [0, 0.68], "title": "step"}, xaxis2={"domain": [0.75, 1], "title": "lag"},
                      yaxis2={"anchor": "x2"})
    return fig


def sync_figure(syncs: list[dict]) -> go.Figure:
    """Weight-sync duration (pause, transfer, resume) per sync, and GB/s where bytes are known."""
    fig = _empty("weight sync")
    if not syncs:
        return fig
    x = [f"v{s['from_version']}→{s['to_version']}" for s in syncs]
    for k, color in (("pause_s", "#fdae6b"), ("transfer_s", "#d62728"), ("resume_s", "#9467bd")):
        fig.add_bar(x=x, y=[s[k] for s in syncs], name=k.removesuffix("_s"), marker_color=color)
    gbs = [s["bytes"] / s["transfer_s"] / 1e9 if s["transfer_s"] > 0 and s["bytes"] > 0 else None for s in syncs]
    fig.add_scatter(x=x, y=gbs, name="GB/s", yaxis="y2", mode="lines+markers")
    fig.update_layout(barmode="stack", yaxis_title="seconds",
                      yaxis2={"overlaying": "y", "side": "right", "title": "GB/s"})
    return fig


def summary_text(rep: idle.IdleReport) -> str:
    s = rep.summary()
    if not s["steps"]:
        return "no RL spans for this job yet (rank SDK, or moeplane agent --follow verl=... / areal=...)"
    tail = f"{s['tail_ratio']:.2f}" if s["tail_ratio"] is not None else "–"
    return (f"steps {int(rep.steps[0])}–{int(rep.steps[-1])} · {s['devices']} devices · black hole "
            f"{s['black_hole_fraction']:.1%} · tail ratio {tail} · sync share {s['sync_share']:.1%} · "
            f"bottleneck: {s['bottleneck'] or '–'}")
