"""Plans page data prep: plan rows in, table rows and plotly figure dicts out (pure).

Plan rows are ``moeplane.controlplane.store.plans.list_plans`` dicts (epoch, status, kind, created_at,
moves, cross_node_moves, predicted_before/after, measured_before/after, ... ; balancedness is
max / mean rank load, 1.0 is perfect; times are unix seconds).
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from moeplane.dashboard.plan_diff import PlacementDiff

STATUS_COLOURS = {
    "proposed": "#f39c12",
    "approved": "#d4ac0d",
    "pushed": "#2e86de",
    "applied": "#27ae60",
    "failed": "#e74c3c",
    "rejected": "#7f8c8d",
    "superseded": "#bdc3c7",
    "rolled_back": "#8e44ad",
}

_SERIES = (
    ("predicted_before", "predicted before", "circle-open", "dash"),
    ("predicted_after", "predicted after", "diamond-open", "dash"),
    ("measured_before", "measured before", "circle", "solid"),
    ("measured_after", "measured after", "diamond", "solid"),
)


def _bal(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def plan_rows(plans: list[dict]) -> list[dict]:
    """One display row per plan (strings), in the order given."""
    rows = []
    for p in plans:
        moves = int(p.get("moves") or 0)
        cross = int(p.get("cross_node_moves") or 0)
        rows.append({
            "epoch": int(p["epoch"]),
            "status": str(p["status"]),
            "kind": str(p.get("kind") or ""),
            "created": _when(p["created_at"]),
            "moves": f"{moves - cross} intra / {cross} cross",
            "predicted": f"{_bal(p.get('predicted_before'))} → {_bal(p.get('predicted_after'))}",
            "measured": f"{_bal(p.get('measured_before'))} → {_bal(p.get('measured_after'))}",
            "applied_step": "" if p.get("applied_step") is None else str(p["applied_step"]),
            "reason": str(p.get("reason") or ""),
        })
    return rows


def timeline_figure(plans: list[dict]) -> dict:
    """``plans-timeline``: balancedness predicted (open markers) and measured (filled) before
    and after each plan, against the plan's creation time; a strip on top shows each plan's
    status by colour."""
    plans = sorted(plans, key=lambda p: p["epoch"])
    x = [p["created_at"] * 1000.0 for p in plans]
    hover = [f"epoch {p['epoch']} · {p['status']}" for p in plans]
    traces = []
    for key, name, symbol, dash in _SERIES:
        traces.append({
            "type": "scatter",
            "mode": "lines+markers",
            "x": x,
            "y": [p.get(key) for p in plans],
            "name": name,
            "text": hover,
            "connectgaps": False,
            "line": {"dash": dash},
            "marker": {"symbol": symbol, "size": 9},
            "hovertemplate": "%{text}<br>" + name + ": %{y:.3f}<extra></extra>",
            "yaxis": "y",
        })
    traces.append({
        "type": "scatter",
        "mode": "markers+text",
        "x": x,
        "y": [0] * len(plans),
        "text": [f"{p['epoch']}" for p in plans],
        "textposition": "top center",
        "customdata": [p["status"] for p in plans],
        "marker": {"size": 14, "symbol": "square",
                   "color": [STATUS_COLOURS.get(str(p["status"]), "#000") for p in plans]},
        "hovertemplate": "epoch %{text}: %{customdata}<extra></extra>",
        "name": "status",
        "showlegend": False,
        "yaxis": "y2",
    })
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"Plans: balancedness predicted vs measured ({len(plans)} plans)",
                      "x": 0.01, "xanchor": "left"},
            "height": 360,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "xaxis": {"type": "date"},
            "yaxis": {"domain": [0.0, 0.78], "title": {"text": "max/mean"}},
            "yaxis2": {"domain": [0.84, 1.0], "visible": False, "range": [-0.5, 1.5]},
            "legend": {"orientation": "h", "y": -0.15},
            "uirevision": "plans",
        },
    }


def diff_figure(diff: PlacementDiff, epoch: int, base: str) -> dict:
    """``plan-diff-graph``: replicas gained (+) and lost (−) per layer × expert on the left;
    changed slots per layer × rank on the right."""
    delta = diff.replica_delta
    peak = max(1, int(np.abs(delta).max()) if delta.size else 1)
    return {
        "data": [
            {
                "type": "heatmap",
                "z": delta.tolist(),
                "colorscale": "RdBu",
                "zmid": 0,
                "zmin": -peak,
                "zmax": peak,
                "colorbar": {"title": {"text": "Δ replicas"}, "x": 0.46},
                "hovertemplate": "layer %{y}, expert %{x}: %{z:+d} replicas<extra></extra>",
                "xaxis": "x",
                "yaxis": "y",
            },
            {
                "type": "heatmap",
                "z": diff.changed_per_rank.tolist(),
                "colorscale": "Oranges",
                "zmin": 0,
                "colorbar": {"title": {"text": "slots"}},
                "hovertemplate": "layer %{y}, rank %{x}: %{z} slots change<extra></extra>",
                "xaxis": "x2",
                "yaxis": "y2",
            },
        ],
        "layout": {
            "title": {"text": f"Plan {epoch} against the running placement ({base}): "
                              f"{diff.slots_changed} slots change in {diff.layers_changed} layers",
                      "x": 0.01, "xanchor": "left"},
            "height": max(300, 80 + 8 * delta.shape[0]),
            "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
            "xaxis": {"domain": [0.0, 0.44], "title": {"text": "logical expert"}},
            "yaxis": {"title": {"text": "layer"}, "autorange": "reversed"},
            "xaxis2": {"domain": [0.54, 1.0], "title": {"text": "EP rank"}, "anchor": "y2"},
            "yaxis2": {"autorange": "reversed", "anchor": "x2"},
        },
    }


def diff_summary(diff: PlacementDiff) -> str:
    return (
        f"{diff.slots_changed} slots change in {diff.layers_changed} layers · "
        f"{diff.experts_gaining} (layer, expert) pairs gain replicas, "
        f"{diff.experts_losing} lose replicas"
    )
