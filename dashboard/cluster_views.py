"""Cluster page data prep: device rows and latest values in, plotly figure dicts out (pure).

The grid puts every device of the cluster in one heatmap that stays readable at 1,024 devices:
nodes are laid out ``per_row`` to a row, each node a block of ``D`` cells (one per device index)
followed by a blank separator column. Cells are coloured by one metric; cells that cross that
metric's alert rule are outlined ("hot spots").

Figures are plain dicts (``{"data": [...], "layout": {...}}``) so callbacks can send or patch
them without plotly's validation cost.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from moeplane.dashboard.units import GIB, byte_unit, fmt_bytes


@dataclass(frozen=True)
class Metric:
    """How one grid metric is shown: ``scale`` divides raw values; ``alert`` is (op, threshold)."""

    name: str
    label: str
    unit: str
    scale: float = 1.0
    alert: tuple[str, float] | None = None
    zmin: float | None = None
    zmax: float | None = None


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("utilization_ratio", "Utilization", "%", 0.01, ("le", 0.10), 0.0, 100.0),
        Metric("memory_used_ratio", "HBM used / total", "%", 0.01, ("ge", 0.95), 0.0, 100.0),
        Metric("host_bound_ratio", "Host-bound ratio", "%", 0.01, ("ge", 0.30), 0.0, 100.0),
        Metric("temperature_celsius", "Temperature", "°C", 1.0, ("ge", 85.0)),
        Metric("power_watts", "Power", "W", 1.0, ("outlier", 3.0)),
        Metric("health_ok", "Health", "ok", 1.0, ("lt", 0.5), 0.0, 1.0),
        Metric("memory_used_bytes", "HBM used", "GiB", GIB, ("outlier", 3.0)),
        Metric("pcie_tx_bytes_per_second", "PCIe TX", "GB/s", 1e9, ("outlier", 3.0)),
        Metric("pcie_rx_bytes_per_second", "PCIe RX", "GB/s", 1e9, ("outlier", 3.0)),
        Metric("nvlink_tx_bytes_per_second", "NVLink TX", "GB/s", 1e9, ("outlier", 3.0)),
        Metric("nvlink_rx_bytes_per_second", "NVLink RX", "GB/s", 1e9, ("outlier", 3.0)),
    )
}
"""Grid metrics. ``memory_used_ratio`` is derived: memory_used_bytes / memory_total_bytes."""

LINK_METRICS = (
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
)

_ALERTS_SUMMARY = ("health_ok", "temperature_celsius", "memory_used_ratio", "host_bound_ratio")


def natural_key(text: str) -> tuple:
    """Sort key that orders ``node-2`` before ``node-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


@dataclass(frozen=True)
class GridLayout:
    """Where each device sits in the grid.

    ``device_ids`` [R, C] object array (``""`` for blank cells); ``row_labels`` [R] (the nodes of
    each row); ``col_labels`` [C]; ``positions`` {device_id: (row, col)}.
    """

    device_ids: np.ndarray
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    positions: dict[str, tuple[int, int]]

    @property
    def key(self) -> str:
        """Identity of the layout: a new key means the figure must be rebuilt, not patched."""
        return f"{self.device_ids.shape}|" + ",".join(self.device_ids.ravel().tolist())


def grid_layout(devices: list[dict], per_row: int | None = None) -> GridLayout:
    """Lay out ``devices`` (rows of ``list_devices``: device_id, node_id, index) as a grid.

    ``per_row`` nodes share a grid row; by default about twice as wide as tall.
    """
    by_node: dict[str, dict[int, str]] = {}
    for d in devices:
        by_node.setdefault(d["node_id"], {})[int(d["index"])] = d["device_id"]
    nodes = sorted(by_node, key=natural_key)
    width = 1 + max((max(ix) for ix in by_node.values()), default=0)
    if per_row is None:
        per_row = max(1, math.ceil(math.sqrt(2 * max(len(nodes), 1) / (width + 1))))
    if per_row < 1:
        raise ValueError(f"per_row: must be >= 1, got {per_row}")
    rows = max(1, math.ceil(len(nodes) / per_row))
    cols = per_row * (width + 1) - 1
    ids = np.full((rows, cols), "", dtype=object)
    positions: dict[str, tuple[int, int]] = {}
    row_nodes: list[list[str]] = [[] for _ in range(rows)]
    for i, node in enumerate(nodes):
        r, c0 = divmod(i, per_row)
        row_nodes[r].append(node)
        for idx, dev in by_node[node].items():
            ids[r, c0 * (width + 1) + idx] = dev
            positions[dev] = (r, c0 * (width + 1) + idx)
    col_labels = tuple(
        "" if (c + 1) % (width + 1) == 0 else str(c % (width + 1)) for c in range(cols)
    )
    labels = tuple(nodes[0] if len(nodes) == 1 else " · ".join(n) for n in row_nodes) if nodes else ("",)
    return GridLayout(ids, labels, col_labels, positions)


def metric_value(values: dict[str, float], metric: str, memory_total: float | None = None) -> float:
    """One device's value of a grid metric (raw units), NaN when not measured."""
    if metric == "memory_used_ratio":
        used = values.get("memory_used_bytes")
        total = values.get("memory_total_bytes") or memory_total
        if used is None or not total:
            return math.nan
        return float(used) / float(total)
    v = values.get(metric)
    return math.nan if v is None else float(v)


def alert_mask(metric: str, values: np.ndarray) -> np.ndarray:
    """Cells that cross ``metric``'s alert rule: bool array shaped like ``values`` (raw units).

    Rules: ``ge``/``le``/``lt`` compare to a threshold; ``outlier`` flags values above the
    median by more than ``k`` × the median absolute deviation (and above 1.5 × the median).
    NaN is never an alert.
    """
    spec = METRICS[metric].alert
    finite = np.isfinite(values)
    out = np.zeros(values.shape, dtype=bool)
    if spec is None or not finite.any():
        return out
    op, x = spec
    v = np.where(finite, values, 0.0)
    if op == "ge":
        out = v >= x
    elif op == "le":
        out = v <= x
    elif op == "lt":
        out = v < x
    elif op == "outlier":
        vals = values[finite]
        med = float(np.median(vals))
        mad = float(np.median(np.abs(vals - med)))
        out = (v > med + x * mad) & (v > 1.5 * med) & (v > 0)
    return out & finite


def _fmt(values: dict[str, float], total: float | None) -> str:
    parts = []
    if "utilization_ratio" in values:
        parts.append(f"util {values['utilization_ratio'] * 100:.0f} %")
    used = values.get("memory_used_bytes")
    tot = values.get("memory_total_bytes") or total
    if used is not None:
        unit = byte_unit(tot or used)
        parts.append(f"memory {fmt_bytes(used, unit)}" + (f" / {fmt_bytes(tot, unit)}" if tot else ""))
    if "host_bound_ratio" in values:
        parts.append(f"host-bound {values['host_bound_ratio'] * 100:.0f} %")
    if "temperature_celsius" in values:
        parts.append(f"{values['temperature_celsius']:.0f} °C")
    if "power_watts" in values:
        parts.append(f"{values['power_watts']:.0f} W")
    if "health_ok" in values:
        parts.append("healthy" if values["health_ok"] >= 0.5 else "UNHEALTHY")
    return "<br>".join(parts) if parts else "no samples"


@dataclass(frozen=True)
class GridData:
    """Per-cell data of the grid for one metric: ``z`` [R, C] display units (NaN blank),
    ``hover`` [R, C] text, ``hot`` list of (row, col) alert cells."""

    z: list
    hover: list
    hot_rows: list
    hot_cols: list


def grid_data(layout: GridLayout, latest: dict[str, dict], metric: str, totals: dict[str, float]) -> GridData:
    """Cell values of ``metric`` from ``latest`` ({device_id: {"metrics": {...}}}).

    ``totals`` {device_id: memory_total_bytes} from the device table (used when the sample
    has no ``memory_total_bytes``).
    """
    if metric not in METRICS:
        raise ValueError(f"metric: unknown grid metric {metric!r}")
    m = METRICS[metric]
    rows, cols = layout.device_ids.shape
    raw = np.full((rows, cols), np.nan)
    hover = [[""] * cols for _ in range(rows)]
    for dev, (r, c) in layout.positions.items():
        vals = latest.get(dev, {}).get("metrics", {})
        raw[r, c] = metric_value(vals, metric, totals.get(dev))
        hover[r][c] = f"<b>{dev}</b><br>" + _fmt(vals, totals.get(dev))
    hot = alert_mask(metric, raw)
    hr, hc = np.nonzero(hot)
    z = np.round(raw / m.scale, 3)
    zl = np.where(np.isfinite(z), z, None).tolist()
    return GridData(zl, hover, hr.tolist(), hc.tolist())


def grid_figure(layout: GridLayout, data: GridData, metric: str) -> dict:
    """The full ``cluster-grid`` figure: trace 0 the heatmap, trace 1 the hot-spot outlines."""
    m = METRICS[metric]
    rows, cols = layout.device_ids.shape
    heat = {
        "type": "heatmap",
        "z": data.z,
        "text": data.hover,
        "hovertemplate": "%{text}<extra></extra>",
        "colorscale": "RdBu" if metric == "health_ok" else "Viridis",
        "colorbar": {"title": {"text": m.unit}},
        "xgap": 1,
        "ygap": 1,
        "hoverongaps": False,
    }
    if m.zmin is not None:
        heat.update(zmin=m.zmin, zmax=m.zmax)
    hot = {
        "type": "scatter",
        "mode": "markers",
        "x": data.hot_cols,
        "y": data.hot_rows,
        "marker": {"symbol": "square-open", "size": 14, "color": "#ff2d2d", "line": {"width": 3}},
        "hoverinfo": "skip",
        "name": "hot spots",
        "showlegend": False,
    }
    return {
        "data": [heat, hot],
        "layout": {
            "title": {"text": f"{m.label} ({m.unit}) — {len(layout.positions)} devices"},
            "height": max(260, 60 + 22 * rows),
            "margin": {"l": 160, "r": 20, "t": 40, "b": 30},
            "xaxis": {
                "tickmode": "array",
                "tickvals": list(range(cols)),
                "ticktext": list(layout.col_labels),
                "showgrid": False,
                "zeroline": False,
                "range": [-0.5, cols - 0.5],
            },
            "yaxis": {
                "tickmode": "array",
                "tickvals": list(range(rows)),
                "ticktext": list(layout.row_labels),
                "autorange": "reversed",
                "showgrid": False,
                "zeroline": False,
            },
            "uirevision": "grid",
        },
    }


def alerts_summary(latest: dict[str, dict], totals: dict[str, float]) -> dict[str, int]:
    """Devices crossing each headline alert rule: {metric: count}."""
    out = {}
    devs = sorted(latest)
    for metric in _ALERTS_SUMMARY:
        vals = np.array([metric_value(latest[d]["metrics"], metric, totals.get(d)) for d in devs])
        out[metric] = int(alert_mask(metric, vals).sum()) if len(vals) else 0
    return out


def link_figure(latest: dict[str, dict]) -> dict:
    """Distribution over devices of each link type's throughput (GB/s), one box per link."""
    traces = []
    for name in LINK_METRICS:
        m = METRICS[name]
        vals = [d["metrics"][name] / m.scale for d in latest.values() if name in d["metrics"]]
        if vals:
            traces.append(
                {"type": "box", "y": vals, "name": m.label, "boxpoints": "suspectedoutliers"}
            )
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Link throughput per link type (GB/s, all devices)"},
            "height": 300,
            "margin": {"l": 50, "r": 20, "t": 40, "b": 30},
            "showlegend": False,
        },
    }


def history_figure(device_id: str, rows: list[dict], metric: str) -> dict:
    """A device's history of one metric from ``device_history`` rows ({"ts", "value"})."""
    m = METRICS.get(metric)
    scale = m.scale if m else 1.0
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": [r["ts"] * 1000.0 for r in rows],
                "y": [r["value"] / scale for r in rows],
                "name": metric,
            }
        ],
        "layout": {
            "title": {"text": f"{device_id} — {m.label if m else metric} ({m.unit if m else ''})"},
            "height": 280,
            "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
            "xaxis": {"type": "date"},
        },
    }
