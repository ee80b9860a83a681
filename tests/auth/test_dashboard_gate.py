"""The dashboard behind tokens: cookie login, 401 without a token, roles reach the Flask side
(never a client's own role header), only operators approve."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from moeplane.controlplane.auth.dashboard import COOKIE, DashboardGate, Forbidden, require_operator
from moeplane.controlplane.auth.tokens import Role, TokenStore
from moeplane.controlplane.store.engine import make_engine
from moeplane.controlplane.store.migrate import upgrade
from tests.controlplane.serverthread import running_server


@pytest.fixture
def tokens(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    yield TokenStore(engine)
    engine.dispose()


async def echo_role(scope, receive, send):
    role = dict(scope["headers"]).get(b"x-moeplane-role", b"none")
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": role})


def get(app, path, cookies=None, **kw):
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", cookies=cookies) as c:
            return await c.get(path, **kw)

    return asyncio.run(run())


def test_gate_roles_and_cookie_login(tokens):
    gate = DashboardGate(echo_role, tokens)
    viewer = tokens.create(Role.VIEWER).secret
    node = tokens.create(Role.NODE, node_id="n0").secret
    assert get(gate, "/dashboard/").status_code == 401
    assert get(gate, "/dashboard/", headers={"x-moeplane-role": "admin"}).status_code == 401
    assert get(gate, "/dashboard/", cookies={COOKIE: node}).status_code == 401  # agents don't browse
    r = get(gate, f"/dashboard/?token={viewer}&tab=plans")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/?tab=plans"
    assert f"{COOKIE}={viewer}" in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]
    r = get(gate, "/dashboard/", cookies={COOKIE: viewer}, headers={"x-moeplane-role": "admin"})
    assert r.status_code == 200 and r.content == b"viewer"  # the client's own header is dropped
    tokens.revoke(tokens.list()[0]["id"])
    assert get(gate, "/dashboard/", cookies={COOKIE: viewer}).status_code == 401  # revoked: at once


def test_gate_is_transparent_when_open():
    r = get(DashboardGate(echo_role, None), "/dashboard/", headers={"x-moeplane-role": "whatever"})
    assert r.status_code == 200


@pytest.mark.parametrize("role,allowed", [("viewer", False), ("operator", True), ("admin", True), (None, True)])
def test_only_operators_change_plans(role, allowed):
    action = require_operator(lambda job, epoch: {"job": job, "epoch": epoch}, lambda: role)
    if allowed:
        assert action("j", 1) == {"job": "j", "epoch": 1}
    else:
        with pytest.raises(Forbidden, match="needs operator"):
            action("j", 1)


def test_live_server_dashboard_needs_a_token(tmp_path):
    with running_server(f"sqlite:///{tmp_path / 'd.sqlite'}", auth=True, dashboard=True) as srv:
        viewer = TokenStore(srv["engine"]).create(Role.VIEWER).secret
        base = f"http://127.0.0.1:{srv['http_port']}"
        with httpx.Client(base_url=base, timeout=10, follow_redirects=True) as c:
            assert c.get("/dashboard/").status_code == 401
            assert c.get(f"/dashboard/?token={viewer}").status_code == 200  # redirect, cookie, page
            assert c.get("/dashboard/_dash-layout").status_code == 200
