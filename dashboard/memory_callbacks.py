"""Memory page callbacks: each device's memory breakdown and the job's offload decisions,
read through ``moeplane.controlplane.store.memory_profiles`` and ``moeplane.controlplane.store.offload`` (the
functions behind REST ``/memory`` and ``/offload/decisions``), re-sent only when a profile, the policy or a decision changed."""

from __future__ import annotations

from dash import Input, Output, State, html, no_update
from sqlalchemy.engine import Engine

from moeplane.controlplane.store import memory_profiles as M
from moeplane.controlplane.store import offload as O
from moeplane.controlplane.store import queries as q
from moeplane.dashboard.memory_views import breakdown_figure, decision_rows, memory_summary

MAX_DECISIONS = 100

_CELL = {"padding": "2px 8px", "borderBottom": "1px solid #eee", "textAlign": "left"}
_COLUMNS = (("decision_id", "id"), ("device", "device"), ("status", "status"), ("verdict", "verdict"),
            ("actions", "actions"), ("peak", "peak now → predicted"), ("measured", "measured used"),
            ("created", "created (UTC)"), ("reason", "reason"))


def decisions_table(rows: list[dict]) -> html.Table:
    head = html.Tr([html.Th(label, style=_CELL) for _k, label in _COLUMNS])
    body = [html.Tr([html.Td(r[k], style=_CELL) for k, _l in _COLUMNS], id=f"offload-row-{r['decision_id']}")
            for r in rows]
    return html.Table([html.Thead(head), html.Tbody(body)],
                      style={"borderCollapse": "collapse", "fontSize": "13px", "width": "100%"})


def register(app, engine: Engine) -> None:
    @app.callback(
        Output("memory-breakdown", "figure"),
        Output("offload-table", "children"),
        Output("memory-status", "children"),
        Output("memory-shown", "data"),
        Input("job-select", "value"),
        Input("memory-tick", "n_intervals"),
        State("memory-shown", "data"),
    )
    def refresh_memory(job_id, _n, shown):
        none = (no_update,) * 4
        if not job_id:
            return *none[:2], "no job has reported yet", no_update
        try:
            version = list(M.profile_version(engine, job_id))
            decisions = O.list_decisions(engine, job_id, limit=MAX_DECISIONS)
        except q.NotFound:
            return *none[:2], f"job {job_id} not found", no_update
        state = {"job": job_id, "version": version,
                 "decisions": [[d["decision_id"], d["status"], d["updated_at"]] for d in decisions]}
        if shown == state:
            return none
        rows = M.memory_breakdown(engine, job_id)
        if not rows and not decisions:
            return (breakdown_figure([]), decisions_table([]),
                    f"job {job_id}: no memory profiles yet (ranks send them through the SDK)", state)
        policy = O.get_policy(engine, job_id)
        status = (f"job {job_id} · offload policy {policy.mode} (high watermark "
                  f"{policy.high_watermark:.0%}, low {policy.low_watermark:.0%}) · " + memory_summary(rows))
        return breakdown_figure(rows), decisions_table(decision_rows(decisions)), status, state
