"""Experts and History page data prep: load arrays in, plotly figure dicts out (pure).

Shapes: ``counts`` [L, E] tokens per logical expert; ``per_rank`` [L, G] tokens per EP rank;
``phy2log`` [L, G*S]; ``layer_bal`` [T, L] balancedness per (step, layer).
"""

from __future__ import annotations

import numpy as np

from moeplane.dashboard.placement import layer_balancedness, rank_loads, replica_counts, slot_loads

MAX_LABELLED_SLOTS = 512  # above this the placement view shows ids on hover only


def expert_heatmap_figure(counts: np.ndarray, title: str) -> dict:
    """``expert-heatmap``: layer × expert tokens from ``counts`` [L, E]."""
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts: expected [L, E], got shape {counts.shape}")
    return {
        "data": [
            {
                "type": "heatmap",
                "z": counts.tolist(),
                "colorscale": "Viridis",
                "colorbar": {"title": {"text": "tokens"}},
                "hovertemplate": "layer %{y}, expert %{x}: %{z} tokens<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": title, "x": 0.01, "xanchor": "left"},
            "height": max(300, 80 + 8 * counts.shape[0]),
            "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
            "xaxis": {"title": {"text": "logical expert"}},
            "yaxis": {"title": {"text": "layer"}, "autorange": "reversed"},
            "uirevision": "experts",
        },
    }


def relative_rank_load(per_rank: np.ndarray) -> np.ndarray:
    """Each rank's load over its layer's mean rank load: float64 [L, G] (1.0 = fair share)."""
    per_rank = np.asarray(per_rank, dtype=np.float64)
    mean = per_rank.mean(axis=1, keepdims=True)
    return np.divide(per_rank, mean, out=np.ones_like(per_rank), where=mean > 0)


def rank_load_figure(per_rank: np.ndarray, title: str) -> dict:
    """``rank-load``: layer × rank heatmap of each rank's load relative to its layer's mean
    (1.0 = fair share). Only the relative values travel (tokens = value × layer mean)."""
    rel = relative_rank_load(per_rank)
    return {
        "data": [rank_load_trace(rel)],
        "layout": {
            "title": {"text": title, "x": 0.01, "xanchor": "left"},
            "height": max(300, 80 + 8 * rel.shape[0]),
            "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
            "xaxis": {"title": {"text": "EP rank"}},
            "yaxis": {"title": {"text": "layer"}, "autorange": "reversed"},
            "uirevision": "ranks",
        },
    }


def rank_load_trace(rel: np.ndarray) -> dict:
    """The heatmap trace of ``rank_load_figure`` from relative loads ``rel`` [L, G]."""
    peak = max(float(rel.max()) if rel.size else 1.0, 1.0)
    return {
        "type": "heatmap",
        "z": np.round(rel, 3).tolist(),
        "colorscale": "RdBu",
        "zmid": 1.0,
        "zmin": max(0.0, 2.0 - peak),
        "zmax": peak,
        "colorbar": {"title": {"text": "× mean"}},
        "hovertemplate": "layer %{y}, rank %{x}: %{z:.2f} × mean<extra></extra>",
    }


def balancedness_figure(steps: list[int], layer_bal: np.ndarray, title: str) -> dict:
    """``balancedness-graph``: job balancedness (mean over layers) per step on top, each
    layer's balancedness per step as a heatmap below. ``layer_bal`` [T, L] for ``steps`` [T]."""
    layer_bal = np.asarray(layer_bal, dtype=np.float64).reshape(len(steps), -1)
    mean = layer_bal.mean(axis=1) if layer_bal.size else np.zeros(0)
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": list(steps),
                "y": np.round(mean, 4).tolist(),
                "name": "job balancedness",
                "xaxis": "x",
                "yaxis": "y2",
                "hovertemplate": "step %{x}: %{y:.3f}<extra>mean over layers</extra>",
            },
            {
                "type": "heatmap",
                "x": list(steps),
                "z": np.round(layer_bal.T, 4).tolist(),
                "colorscale": "YlOrRd",
                "reversescale": True,
                "zmin": 1.0,
                "colorbar": {"title": {"text": "max/mean"}, "len": 0.65, "y": 0.33},
                "hovertemplate": "step %{x}, layer %{y}: %{z:.3f}<extra></extra>",
                "xaxis": "x",
                "yaxis": "y",
            },
        ],
        "layout": {
            "title": {"text": title, "x": 0.01, "xanchor": "left"},
            "height": 460,
            "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "showlegend": False,
            "xaxis": {"title": {"text": "step"}, "anchor": "y"},
            "yaxis": {"domain": [0.0, 0.65], "title": {"text": "layer"}, "autorange": "reversed"},
            "yaxis2": {"domain": [0.72, 1.0], "title": {"text": "max/mean"}, "anchor": "x"},
            "uirevision": "balancedness",
        },
    }


def placement_figure(counts: np.ndarray, phy2log: np.ndarray, ranks: int, layer: int) -> dict:
    """``placement-graph``: which logical experts sit on which rank in one ``layer``.

    Rows are ranks, columns slots; cell text is the logical expert id, ``*`` marks a replicated
    expert; colour is the slot's tokens (its expert's load split over its replicas).
    """
    counts = np.asarray(counts)
    phy2log = np.asarray(phy2log, dtype=np.int64)
    if not 0 <= layer < counts.shape[0]:
        raise ValueError(f"layer: must be in 0..{counts.shape[0] - 1}, got {layer}")
    per_slot = slot_loads(counts[layer : layer + 1], phy2log[layer : layer + 1])[0]
    reps = replica_counts(phy2log[layer : layer + 1], counts.shape[1])[0]
    ids = phy2log[layer].reshape(ranks, -1)
    text = [[f"{e}*" if reps[e] > 1 else str(e) for e in row] for row in ids.tolist()]
    return {
        "data": [
            {
                "type": "heatmap",
                "z": np.round(per_slot.reshape(ranks, -1)).tolist(),
                "text": text,
                "texttemplate": "%{text}" if ids.size <= MAX_LABELLED_SLOTS else None,
                "colorscale": "Blues",
                "colorbar": {"title": {"text": "tokens"}},
                "hovertemplate": "rank %{y}, slot %{x}: expert %{text}, %{z} tokens<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": f"Placement of layer {layer} (expert id per slot, * = replicated)"},
            "height": min(720, max(260, 60 + 18 * ranks)),
            "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
            # one tick per slot/rank only while few: thousands of tick labels cost seconds to lay out
            "xaxis": {"title": {"text": "slot on rank"}, "dtick": 1 if ids.shape[1] <= 64 else None},
            "yaxis": {"title": {"text": "EP rank"}, "autorange": "reversed",
                      "dtick": 1 if ranks <= 64 else None},
        },
    }


def layer_balancedness_of(counts: np.ndarray, phy2log: np.ndarray, ranks: int) -> np.ndarray:
    """Balancedness of each layer of ``counts`` [L, E] under ``phy2log``: float64 [L]."""
    return layer_balancedness(rank_loads(counts, phy2log, ranks))


def step_time_figure(rows: list[dict], title: str) -> dict:
    """Per-step mean and max step time (s) and mean host-bound ratio from ``step_stats`` rows."""
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    steps = sorted(by_step)
    mean_t = [float(np.mean([r["step_time_s"] for r in by_step[s]])) for s in steps]
    max_t = [float(np.max([r["step_time_s"] for r in by_step[s]])) for s in steps]
    hb = [float(np.mean([r["host_bound_ratio"] for r in by_step[s]])) * 100 for s in steps]
    return {
        "data": [
            {"type": "scatter", "mode": "lines", "x": steps, "y": mean_t, "name": "mean step time (s)"},
            {"type": "scatter", "mode": "lines", "x": steps, "y": max_t, "name": "max step time (s)"},
            {
                "type": "scatter",
                "mode": "lines",
                "x": steps,
                "y": hb,
                "name": "mean host-bound (%)",
                "yaxis": "y2",
            },
        ],
        "layout": {
            "title": {"text": title, "x": 0.01, "xanchor": "left"},
            "height": 300,
            "margin": {"l": 50, "r": 50, "t": 40, "b": 40},
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": "s"}},
            "yaxis2": {"title": {"text": "%"}, "overlaying": "y", "side": "right"},
        },
    }
