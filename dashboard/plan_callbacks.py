"""Plans page callbacks: the plan timeline and table (refreshed on the page's tick, re-sent
only when a plan changes), approve / reject buttons on open plans, and the diff of the chosen
plan against the running placement.

Approve and reject go through the ``approve`` / ``reject`` plan actions given to
``create_dash`` (the server passes the REST handlers, see ``moeplane.dashboard.actions``).
"""

from __future__ import annotations

from dash import ALL, Input, Output, State, ctx, html, no_update
from dash.exceptions import PreventUpdate
from sqlalchemy.engine import Engine

from moeplane.controlplane.domain.lifecycle import OPEN, Conflict, Status
from moeplane.controlplane.store import plans as P
from moeplane.controlplane.store import queries as q
from moeplane.controlplane.store.placements import Geometry, PlacementSource, identity
from moeplane.dashboard.actions import PlanAction
from moeplane.dashboard.plan_diff import changed_slots, placement_diff
from moeplane.dashboard.plan_views import (
    STATUS_COLOURS,
    diff_figure,
    diff_summary,
    plan_rows,
    timeline_figure,
)

MAX_PLANS = 200  # plans shown in the timeline and table
MAX_SLOT_ROWS = 100  # changed slots listed under the diff

_CELL = {"padding": "2px 8px", "borderBottom": "1px solid #eee", "textAlign": "left"}
_COLUMNS = (("epoch", "epoch"), ("status", "status"), ("kind", "kind"), ("created", "created (UTC)"),
            ("moves", "moves"), ("predicted", "predicted"), ("measured", "measured"),
            ("applied_step", "applied at step"), ("reason", "reason"))


def _button(kind: str, epoch: int, label: str, enabled: bool) -> html.Button:
    return html.Button(label, id={"type": f"plan-{kind}", "epoch": epoch}, n_clicks=0,
                       disabled=not enabled, style={"marginRight": "4px"})


def plans_table(rows: list[dict], can_approve: bool) -> html.Table:
    head = html.Tr([html.Th(label, style=_CELL) for _k, label in _COLUMNS] + [html.Th("", style=_CELL)])
    body = []
    for r in rows:
        status = r["status"]
        buttons = []
        if status in OPEN:
            if status == Status.PROPOSED:
                buttons.append(_button("approve", r["epoch"], "Approve", can_approve))
            buttons.append(_button("reject", r["epoch"], "Reject", True))
        cells = [html.Td(r[k], style=_CELL | ({"color": STATUS_COLOURS.get(status, "#000"), "fontWeight": "bold"}
                                                if k == "status" else {}))
                 for k, _label in _COLUMNS]
        body.append(html.Tr(cells + [html.Td(buttons, style=_CELL)], id=f"plan-row-{r['epoch']}"))
    return html.Table([html.Thead(head), html.Tbody(body)],
                      style={"borderCollapse": "collapse", "fontSize": "13px", "width": "100%"})


def _running(placements: PlacementSource, engine: Engine, job_id: str, plan: dict) -> tuple:
    """The running placement to compare ``plan`` with: (phy2log [L, G*S], label); before the
    first applied plan, the identity placement in ``plan``'s geometry."""
    job = q.get_job(engine, job_id)
    running = placements.running(job)
    if running is not None and running.epoch:
        return running.phy2log, running.source
    start = identity(Geometry(plan["layers"], job["experts"], plan["world_size"], plan["slots_per_rank"]))
    return start.phy2log, start.source


def register(app, engine: Engine, approve: PlanAction | None, reject: PlanAction,
             placements: PlacementSource) -> None:
    @app.callback(
        Output("plans-timeline", "figure"),
        Output("plans-table", "children"),
        Output("plans-status", "children"),
        Output("plan-select", "options"),
        Output("plan-select", "value"),
        Output("plans-shown", "data"),
        Input("job-select", "value"),
        Input("plans-tick", "n_intervals"),
        Input("plan-acted", "data"),
        State("plans-shown", "data"),
        State("plan-select", "value"),
    )
    def refresh_plans(job_id, _n, _acted, shown, selected):
        none = (no_update,) * 6
        if not job_id:
            return *none[:2], "no job has reported yet", *none[3:]
        try:
            plans = P.list_plans(engine, job_id, limit=MAX_PLANS)
            policy = P.get_policy(engine, job_id)
        except q.NotFound:
            return *none[:2], f"job {job_id} not found", *none[3:]
        state = {"job": job_id, "mode": str(policy.mode),
                 "plans": [[p["epoch"], str(p["status"]), p["updated_at"]] for p in plans]}
        if shown == state:
            return none
        epochs = [p["epoch"] for p in plans]
        if selected not in epochs:
            open_ = [p["epoch"] for p in plans if p["status"] in OPEN]
            selected = open_[0] if open_ else (epochs[0] if epochs else None)
        running = next((p for p in plans if p["status"] == Status.APPLIED), None)
        status = (
            f"job {job_id} · policy {policy.mode} · {len(plans)} plans · running placement: "
            + (f"epoch {running['epoch']}" if running else "identity (no plan applied yet)")
            + ("" if approve is not None else " · approval needs the control plane (moeplane serve)")
        )
        options = [{"label": f"epoch {p['epoch']} ({p['status']})", "value": p["epoch"]} for p in plans]
        return (timeline_figure(plans), plans_table(plan_rows(plans), approve is not None), status,
                options, selected, state)

    @app.callback(
        Output("plan-action-result", "children"),
        Output("plan-acted", "data"),
        Input({"type": "plan-approve", "epoch": ALL}, "n_clicks"),
        Input({"type": "plan-reject", "epoch": ALL}, "n_clicks"),
        State("job-select", "value"),
        State("plan-acted", "data"),
        prevent_initial_call=True,
    )
    def act(_approvals, _rejections, job_id, acted):
        trigger = ctx.triggered_id
        if not trigger or not job_id or not any(t["value"] for t in ctx.triggered):
            raise PreventUpdate  # buttons (re)rendered, not clicked
        epoch = int(trigger["epoch"])
        kind = trigger["type"].removeprefix("plan-")
        action = approve if kind == "approve" else reject
        if action is None:
            return f"cannot {kind} plan {epoch}: approval needs the control plane (moeplane serve)", no_update
        try:
            plan = action(job_id, epoch)
        except (Conflict, q.NotFound, ValueError) as exc:
            return f"cannot {kind} plan {epoch}: {exc}", (acted or 0) + 1
        return f"plan {epoch}: {kind}d, now {plan['status']}", (acted or 0) + 1

    @app.callback(
        Output("plan-diff-summary", "children"),
        Output("plan-diff-graph", "figure"),
        Output("plan-diff-slots", "children"),
        Input("plan-select", "value"),
        Input("plans-shown", "data"),
        State("job-select", "value"),
    )
    def show_diff(epoch, _shown, job_id):
        blank = {"data": [], "layout": {"height": 120, "xaxis": {"visible": False},
                                        "yaxis": {"visible": False}}}
        if not job_id or epoch is None:
            return "no plan selected", blank, []
        try:
            plan = P.get_plan(engine, job_id, int(epoch))
            running, base = _running(placements, engine, job_id, plan)
            experts = q.get_job(engine, job_id)["experts"]
            diff = placement_diff(running, plan["phy2log"], experts, plan["world_size"])
        except (q.NotFound, ValueError) as exc:
            return f"cannot compare plan {epoch} with the running placement: {exc}", blank, []
        nodes = len(q.list_nodes(engine, job_id=job_id))
        per_node = plan["world_size"] // nodes if nodes and plan["world_size"] % nodes == 0 else None
        slots = changed_slots(running, plan["phy2log"], plan["world_size"], per_node, MAX_SLOT_ROWS)
        head = html.Tr([html.Th(h, style=_CELL) for h in
                        ("layer", "rank", "slot", "expert before", "expert after", "crosses nodes")])
        body = [html.Tr([html.Td(str(s[k]) if s[k] is not None else "?", style=_CELL)
                         for k in ("layer", "rank", "slot", "before", "after", "cross_node")])
                for s in slots]
        more = diff.slots_changed - len(slots)
        table = [html.Table([html.Thead(head), html.Tbody(body)],
                            style={"borderCollapse": "collapse", "fontSize": "13px"})]
        if more > 0:
            table.append(html.Div(f"… and {more} more changed slots", style={"color": "#777"}))
        summary = f"plan {epoch} ({plan['status']}) against the running placement ({base}): " + diff_summary(diff)
        return summary, diff_figure(diff, int(epoch), base), table
