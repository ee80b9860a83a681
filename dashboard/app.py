"""The Dash app factory. Nothing happens at import; ``create_dash`` builds an app bound to an
engine. Mount ``create_dash(engine).server`` (a Flask app) under ``/dashboard`` of the FastAPI
app with ``a2wsgi.WSGIMiddleware``; Flask then sees ``SCRIPT_NAME=/dashboard`` and routes
relative to it, while the browser requests ``requests_pathname_prefix``.

Pages (client-side routing through ``dcc.Location``, no full reloads): ``cluster`` (default),
``experts``, ``plans``, ``memory``, ``history``, ``rl``.

Plan approval publishes on the bus, which lives on the server's event loop: the server passes
``approve`` / ``reject`` (``moeplane.dashboard.actions.executor_plan_actions``: the executor runs on
that loop). Without ``approve`` the Plans page shows plans but cannot approve; without
``reject`` it rejects through the same store transition as REST.
"""

from __future__ import annotations

import dash
from dash import Input, Output
from sqlalchemy.engine import Engine

from moeplane.controlplane.store.placements import PlacementSource
from moeplane.dashboard import (
    cluster_callbacks,
    expert_callbacks,
    history_callbacks,
    memory_callbacks,
    pages,
    plan_callbacks,
    rl_callbacks,
)
from moeplane.dashboard.actions import PlanAction, store_reject
from moeplane.dashboard.plotly_bundle import serve_partial_plotly
from moeplane.dashboard.source import BalancednessCache


def create_dash(
    engine: Engine,
    *,
    requests_pathname_prefix: str = "/dashboard/",
    interval_ms: int = 1000,
    balancedness_window: int = 60,
    approve: PlanAction | None = None,
    reject: PlanAction | None = None,
    partial_plotly: bool = True,
    placements: PlacementSource | None = None,
) -> dash.Dash:
    """Build the dashboard on ``engine`` (read through ``moeplane.controlplane.store.queries``).

    ``requests_pathname_prefix`` is the path the browser sees (ends with ``/``);
    ``interval_ms`` the live refresh period; ``balancedness_window`` the number of recent steps
    in the balancedness view; ``approve`` / ``reject`` the plan actions ``(job_id, epoch) ->
    plan summary`` behind the Plans page's buttons; ``partial_plotly`` serves plotly.js's
    cartesian bundle instead of Dash's full one (``moeplane.dashboard.plotly_bundle``);
    ``placements`` the process's placement source (shared with REST and the controller).
    """
    placements = placements or PlacementSource(engine)
    if not requests_pathname_prefix.startswith("/") or not requests_pathname_prefix.endswith("/"):
        raise ValueError(
            f"requests_pathname_prefix: must start and end with '/', got {requests_pathname_prefix!r}"
        )
    if interval_ms < 100:
        raise ValueError(f"interval_ms: must be >= 100, got {interval_ms}")
    app = dash.Dash(
        __name__,
        routes_pathname_prefix="/",
        requests_pathname_prefix=requests_pathname_prefix,
        title="moeplane",
        update_title=None,
        suppress_callback_exceptions=True,
        serve_locally=True,
    )
    prefix = requests_pathname_prefix
    app.layout = pages.shell(prefix)
    if partial_plotly:
        serve_partial_plotly(app.server)  # 1.4 MB of plotly.js instead of 4.8 MB: half the first view

    @app.callback(Output("page", "children"), Input("url", "pathname"))
    def route(pathname):
        slug = app.strip_relative_path(pathname or prefix) or "cluster"
        if slug == "experts":
            return pages.experts_page(interval_ms)
        if slug == "plans":
            return pages.plans_page(interval_ms)
        if slug == "memory":
            return pages.memory_page(interval_ms)
        if slug == "history":
            return pages.history_page()
        if slug == "rl":
            return rl_callbacks.page(interval_ms)
        return pages.cluster_page(interval_ms)

    cluster_callbacks.register(app, engine)
    expert_callbacks.register(app, engine, BalancednessCache(balancedness_window), placements)
    plan_callbacks.register(app, engine, approve, reject or store_reject(engine), placements)
    memory_callbacks.register(app, engine)
    history_callbacks.register(app, engine)
    rl_callbacks.register(app, engine)
    return app
