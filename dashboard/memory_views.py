"""Memory page data prep: breakdown and decision rows in, figure dicts and table rows out (pure).

Breakdown rows are ``moeplane.controlplane.store.offload.memory_breakdown`` dicts (bytes): per device
parameters_bytes, gradients_bytes, optimizer_bytes, activations_peak_bytes, other_bytes,
used_bytes, capacity_bytes, high/low_watermark_bytes, applied_actions, decision. Decision rows
are ``list_decisions`` dicts.
"""

from __future__ import annotations

from datetime import UTC, datetime

from moeplane.dashboard.units import byte_unit, fmt_bytes

PARTS = (
    ("parameters_bytes", "parameters", "#1f77b4"),
    ("gradients_bytes", "gradients", "#ff7f0e"),
    ("optimizer_bytes", "optimizer state", "#2ca02c"),
    ("activations_peak_bytes", "activations (peak)", "#d62728"),
    ("other_bytes", "other (workspace, cache)", "#9d9d9d"),
)


def breakdown_figure(rows: list[dict]) -> dict:
    """``memory-breakdown``: one stacked bar per device of parameters, gradients, optimizer
    state, peak activations and the rest; capacity and the high watermark as markers. The
    unit is GiB, or a smaller binary unit when the largest capacity is under 1 GiB."""
    ids = [r["device_id"] for r in rows]
    unit, scale = byte_unit(max((float(r["capacity_bytes"] or 0) for r in rows), default=None))

    def scaled(v) -> float | None:
        return None if v is None else round(float(v) / scale, 3)

    traces = [
        {"type": "bar", "x": ids, "y": [scaled(r[key]) for r in rows], "name": name,
         "marker": {"color": colour},
         "hovertemplate": "%{x}: %{y:.2f} " + unit + "<extra>" + name + "</extra>"}
        for key, name, colour in PARTS
    ]
    traces.append({"type": "scatter", "mode": "markers", "x": ids,
                   "y": [scaled(r["capacity_bytes"]) for r in rows], "name": "capacity",
                   "marker": {"symbol": "line-ew-open", "size": 14, "color": "#000",
                              "line": {"width": 2}},
                   "hovertemplate": "%{x}: capacity %{y:.1f} " + unit + "<extra></extra>"})
    traces.append({"type": "scatter", "mode": "markers", "x": ids,
                   "y": [scaled(r["high_watermark_bytes"]) for r in rows],
                   "name": "high watermark",
                   "marker": {"symbol": "line-ew-open", "size": 14, "color": "#e74c3c",
                              "line": {"width": 2}},
                   "hovertemplate": "%{x}: high watermark %{y:.1f} " + unit + "<extra></extra>"})
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"Device memory breakdown ({len(rows)} devices, {unit})",
                      "x": 0.01, "xanchor": "left"},
            "barmode": "stack",
            "height": 380,
            "margin": {"l": 50, "r": 20, "t": 40, "b": 80},
            "xaxis": {"type": "category", "tickangle": -45,
                      "showticklabels": len(rows) <= 64},
            "yaxis": {"title": {"text": unit}},
            "legend": {"orientation": "h", "y": 1.08, "x": 1.0, "xanchor": "right"},
            "uirevision": "memory",
        },
    }


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def action_text(actions: list[dict]) -> str:
    """``kind: layer, layer`` per action, joined with ``; `` (``–`` for none)."""
    return "; ".join(f"{a['kind']}: {', '.join(map(str, a['layers']))}" for a in actions) or "–"


def decision_rows(decisions: list[dict]) -> list[dict]:
    """One display row per offload decision (strings), in the order given."""
    out = []
    for d in decisions:
        measured = d.get("measured_used_bytes")
        unit, scale = byte_unit(max(d["peak_now_bytes"], d["predicted_peak_bytes"]))
        out.append({
            "decision_id": int(d["decision_id"]),
            "device": str(d["device_id"]),
            "status": str(d["status"]),
            "verdict": str(d["verdict"]),
            "actions": action_text(d.get("actions") or []),
            "peak": f"{d['peak_now_bytes'] / scale:.1f} → "
                    f"{d['predicted_peak_bytes'] / scale:.1f} {unit}",
            "measured": "–" if measured is None else fmt_bytes(measured, (unit, scale)),
            "created": _when(d["created_at"]),
            "reason": str(d.get("reason") or ""),
        })
    return out


def memory_summary(rows: list[dict]) -> str:
    """Devices above their high watermark, with actions in effect, and with an open decision."""
    over = sum(1 for r in rows if r["used_bytes"] > r["high_watermark_bytes"])
    acting = sum(1 for r in rows if r.get("applied_actions"))
    open_ = sum(1 for r in rows if r.get("decision") and r["decision"]["status"] in ("proposed", "approved"))
    return (f"{len(rows)} devices profiled · {over} above the high watermark · "
            f"{acting} with offload in effect · {open_} with an open decision")
