"""Experts and History page callbacks, and the job selector.

The Experts page refreshes on its tick: when the latest step (or the nodes reporting it)
changes for the same job and placement, the figures are patched in place (only z/x/y data and
titles travel); a new job, shape or placement sends whole figures.
"""

from __future__ import annotations

import numpy as np
from dash import Input, Output, Patch, State, ctx, no_update
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.placements import PlacementSource
from moeplane.dashboard.expert_views import (
    balancedness_figure,
    expert_heatmap_figure,
    placement_figure,
    rank_load_figure,
    rank_load_trace,
    relative_rank_load,
    step_time_figure,
)
from moeplane.dashboard.placement import layer_balancedness, rank_loads
from moeplane.dashboard.ranges import history_range
from moeplane.dashboard.source import (
    BalancednessCache,
    current_placement,
    placements_at_steps,
)


def _empty(title: str) -> dict:
    return {"data": [], "layout": {"title": {"text": title}, "height": 260}}


def register(app, engine: Engine, cache: BalancednessCache, running: PlacementSource) -> None:
    """``running``: the placement source; a plan's blob is read once per plan, not per refresh."""

    @app.callback(
        Output("job-select", "options"),
        Output("job-select", "value"),
        Input("jobs-tick", "n_intervals"),
        State("job-select", "value"),
        State("job-select", "options"),
    )
    def refresh_jobs(_n, value, options):
        jobs = q.list_jobs(engine)
        ids = [j["job_id"] for j in jobs]
        opts = no_update if options is not None and [o["value"] for o in options] == ids else [
            {"label": j, "value": j} for j in ids
        ]
        if value in ids:
            return opts, no_update
        newest = max(jobs, key=lambda j: (j["latest_step"] is not None, j["created_at"]), default=None)
        return opts, (newest["job_id"] if newest else None)

    @app.callback(
        Output("expert-heatmap", "figure"),
        Output("rank-load", "figure"),
        Output("balancedness-graph", "figure"),
        Output("placement-graph", "figure"),
        Output("experts-shown", "data"),
        Output("experts-status", "children"),
        Input("job-select", "value"),
        Input("experts-tick", "n_intervals"),
        Input("placement-layer", "value"),
        State("experts-shown", "data"),
    )
    def refresh_experts(job_id, _n, layer, shown):
        none = (no_update,) * 5
        if not job_id:
            return *none, "no job has reported yet"
        try:
            latest = q.latest_loads(engine, job_id)
        except q.NotFound:
            return *none, f"job {job_id} not found"
        if latest is None:
            return *none, f"job {job_id}: no expert loads yet"
        counts = latest["counts"]
        placement = current_placement(engine, job_id, counts.shape, running)
        g = placement.geometry
        nodes = len(q.list_nodes(engine, job_id=job_id))
        state = {"job": job_id, "step": latest["step"], "nodes": latest["nodes_reported"],
                 "placement": list(map(str, placement.key)), "layer": layer}
        if shown == state:
            return *none, no_update
        per_rank = rank_loads(counts, placement.phy2log, g.ranks)
        steps, bal = cache.recent(engine, job_id, latest["step"], placement, nodes)
        bal_now = float(layer_balancedness(per_rank).mean())
        status = (
            f"job {job_id} · step {latest['step']} · {latest['nodes_reported']}/{nodes} nodes reported · "
            f"{g.layers} layers × {g.experts} experts on {g.ranks} ranks × {g.slots_per_rank} slots "
            f"({placement.source} placement) · balancedness {bal_now:.3f}"
        )
        heat_title = f"Expert load, step {latest['step']} (tokens)"
        rank_title = f"Per-rank load, × layer mean ({placement.source} placement)"
        bal_title = f"Balancedness per layer, last {len(steps)} steps"
        layer = int(layer) if layer is not None and 0 <= int(layer) < g.layers else 0
        placement_fig = (
            placement_figure(counts, placement.phy2log, g.ranks, layer)
            if ctx.triggered_id != "experts-tick" or not shown or shown.get("step") != latest["step"]
            else no_update
        )
        same = bool(shown) and all(shown.get(k) == state[k] for k in ("job", "placement"))
        if not same:
            return (
                expert_heatmap_figure(counts, heat_title),
                rank_load_figure(per_rank, rank_title),
                balancedness_figure(steps, bal, bal_title),
                placement_fig,
                state,
                status,
            )
        heat = Patch()
        heat["data"][0]["z"] = counts.tolist()
        heat["layout"]["title"]["text"] = heat_title
        rank_patch = Patch()
        rank_patch["data"][0] = rank_load_trace(relative_rank_load(per_rank))
        rank_patch["layout"]["title"]["text"] = rank_title
        balf = balancedness_figure(steps, bal, bal_title)
        bal_patch = Patch()
        bal_patch["data"][0]["x"] = balf["data"][0]["x"]
        bal_patch["data"][0]["y"] = balf["data"][0]["y"]
        bal_patch["data"][1]["x"] = balf["data"][1]["x"]
        bal_patch["data"][1]["z"] = balf["data"][1]["z"]
        bal_patch["layout"]["title"]["text"] = bal_title
        return heat, rank_patch, bal_patch, placement_fig, state, status

    @app.callback(
        Output("history-heatmap", "figure"),
        Output("history-rank-load", "figure"),
        Output("history-balancedness", "figure"),
        Output("history-steptime", "figure"),
        Output("history-status", "children"),
        Input("history-apply", "n_clicks"),
        Input("job-select", "value"),
        State("history-kind", "value"),
        State("history-from", "value"),
        State("history-to", "value"),
    )
    def show_history(_clicks, job_id, kind, start, end):
        blank = (_empty(""),) * 4
        if not job_id:
            return *blank, "no job has reported yet"
        try:
            job = q.get_job(engine, job_id)
            rng = history_range(kind or "steps", start, end, job["latest_step"])
            rows = q.loads_history(engine, job_id, rng)
            stats = q.step_stats_history(
                engine, job_id, q.Range(start=rng.start, end=rng.end, step_start=rng.step_start,
                                        step_end=rng.step_end, limit=q.MAX_LIMIT)
            )
        except (ValueError, q.NotFound) as exc:
            return *blank, f"cannot show history: {exc}"
        if not rows:
            return *blank, f"job {job_id}: no expert loads in that range"
        shape = rows[-1]["counts"].shape
        rows = [r for r in rows if r["counts"].shape == shape]
        steps = [r["step"] for r in rows]
        placements = placements_at_steps(engine, job_id, shape, steps, running)
        total = np.sum([r["counts"] for r in rows], axis=0, dtype=np.int64)
        bal = np.stack([layer_balancedness(rank_loads(r["counts"], p.phy2log, p.geometry.ranks))
                        for r, p in zip(rows, placements, strict=True)])
        last = placements[-1]  # per-rank load of the summed range under its final placement
        per_rank = rank_loads(total, last.phy2log, last.geometry.ranks)
        span = f"steps {steps[0]}–{steps[-1]}"
        used = sorted({p.source for p in placements})
        status = (f"job {job_id} · {span} ({len(steps)} steps, at most {rng.limit} read) · "
                  f"placement: {', '.join(used)}")
        return (
            expert_heatmap_figure(total, f"Expert load summed over {span} (tokens)"),
            rank_load_figure(per_rank, f"Per-rank load, × layer mean, {span} ({last.source} placement)"),
            balancedness_figure(steps, bal, f"Balancedness per layer, {span}"),
            step_time_figure(stats, f"Step time and host-bound ratio, {span}"),
            status,
        )
