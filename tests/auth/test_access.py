"""Access control against the live server: REST roles (401/403), immediate revocation, node
tokens on gRPC ingest (UNAUTHENTICATED / PERMISSION_DENIED), open mode only on loopback."""

from __future__ import annotations

import grpc
import httpx
import pytest

from moeplane.controlplane.auth.tokens import Role, TokenStore
from moeplane.controlplane.balancing.placement import identity_placement
from moeplane.controlplane.server import serve
from moeplane.controlplane.settings import Settings
from moeplane.controlplane.store import plans as P
from tests import aio
from tests.auth.streams import first_reply
from tests.controlplane.serverthread import running_server


def _auth(secret: str | None) -> dict:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('auth') / 'm.sqlite'}"
    with running_server(url, auth=True) as srv:
        tokens = TokenStore(srv["engine"])
        srv["tokens"] = {r: tokens.create(r).secret for r in ("viewer", "operator", "admin")}
        srv["store"] = tokens
        srv["base"] = f"http://127.0.0.1:{srv['http_port']}"
        # a job with a proposed plan
        kind, _ = aio.run(first_reply(srv["grpc_port"], "node-0", tokens.create(Role.NODE, node_id="node-0").secret))
        assert kind == "ok"
        yield srv


def test_no_token_401_weak_role_403(server):
    base, tok = server["base"], server["tokens"]
    with httpx.Client(base_url=base, timeout=10) as c:
        assert c.get("/api/v1/health").status_code == 200  # public
        r = c.get("/api/v1/jobs")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/api/v1/jobs", headers=_auth("mp_not-a-token")).status_code == 401
        assert c.get("/metrics").status_code == 401
        assert c.get("/api/v1/jobs", headers=_auth(tok["viewer"])).status_code == 200
        assert c.get("/metrics", headers=_auth(tok["viewer"])).status_code == 200
        assert c.get("/api/v1/tokens", headers=_auth(tok["operator"])).status_code == 403
        assert c.get("/api/v1/tokens", headers=_auth(tok["admin"])).status_code == 200
        r = c.put("/api/v1/jobs/job-1/policy", json={"mode": "manual"}, headers=_auth(tok["viewer"]))
        assert r.status_code == 403
        r = c.put("/api/v1/jobs/job-1/policy", json={"mode": "manual"}, headers=_auth(tok["operator"]))
        assert r.status_code == 200, r.text


def test_viewer_cannot_approve_operator_can(server):
    engine, tok = server["engine"], server["tokens"]
    epoch = P.create_plan(engine, "job-1", identity_placement(4, 8, 2 * (4))[:, ::-1].copy(), world_size=2, slots_per_rank=4)
    with httpx.Client(base_url=server["base"], timeout=10) as c:
        url = f"/api/v1/jobs/job-1/plans/{epoch}/approve"
        assert c.post(url).status_code == 401
        r = c.post(url, headers=_auth(tok["viewer"]))
        assert r.status_code == 403 and "operator" in r.json()["detail"]
        assert P.get_plan(engine, "job-1", epoch)["status"] == "proposed"
        r = c.post(url, headers=_auth(tok["operator"]))
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "pushed"


def test_revoked_token_stops_at_once(server):
    store = server["store"]
    made = store.create(Role.ADMIN, name="short-lived")
    with httpx.Client(base_url=server["base"], timeout=10) as c:
        h = _auth(made.secret)
        assert c.get("/api/v1/jobs", headers=h).status_code == 200
        # revoke over REST with another admin token; the very next request fails
        r = c.delete(f"/api/v1/tokens/{made.principal.token_id}", headers=_auth(server["tokens"]["admin"]))
        assert r.status_code == 200 and r.json()["revoked_at"] is not None
        assert c.get("/api/v1/jobs", headers=h).status_code == 401
        r = c.post("/api/v1/tokens", json={"role": "node", "node_id": "node-9"},
                   headers=_auth(server["tokens"]["admin"]))
        assert r.status_code == 201 and r.json()["secret"].startswith("mp_")
        assert store.authenticate(r.json()["secret"]).node_id == "node-9"
        r = c.post("/api/v1/tokens", json={"role": "viewer", "node_id": "node-9"},
                   headers=_auth(server["tokens"]["admin"]))
        assert r.status_code == 422


def test_node_tokens_on_ingest(server):
    store, port = server["store"], server["grpc_port"]
    a = store.create(Role.NODE, node_id="node-a")
    kind, msg = aio.run(first_reply(port, "node-a", a.secret, first_rank=2))
    assert kind == "ok" and msg.WhichOneof("body") == "config"
    assert aio.run(first_reply(port, "node-b", a.secret)) == ("error", grpc.StatusCode.PERMISSION_DENIED)
    assert aio.run(first_reply(port, "node-a", None)) == ("error", grpc.StatusCode.UNAUTHENTICATED)
    assert aio.run(first_reply(port, "node-a", server["tokens"]["viewer"])) == (
        "error", grpc.StatusCode.PERMISSION_DENIED)
    store.revoke(a.principal.token_id)
    assert aio.run(first_reply(port, "node-a", a.secret, first_rank=2)) == ("error", grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("where", [{"http_host": "0.0.0.0"}, {"grpc_listen": "0.0.0.0:0"}])
def test_open_mode_refused_off_loopback(tmp_path, capsys, where):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'm.sqlite'}", http_port=0, dashboard=False,
                        **({"grpc_listen": "127.0.0.1:0"} | where))
    assert aio.run(serve(settings, signals=False)) == 2
    err = capsys.readouterr().err
    assert "refusing to run without access control" in err and "--auth" in err
    assert not (tmp_path / "m.sqlite").exists()  # refused before touching anything


def test_open_mode_on_loopback_says_so(tmp_path, capsys):
    with running_server(f"sqlite:///{tmp_path / 'm.sqlite'}") as srv:
        assert httpx.get(f"http://127.0.0.1:{srv['http_port']}/api/v1/jobs").status_code == 200
    assert "running OPEN" in capsys.readouterr().out


def test_plan_matrix_is_untouched_by_denied_calls(server):
    # a viewer's rollback is refused before anything is created
    engine = server["engine"]
    before = len(P.list_plans(engine, "job-1"))
    r = httpx.post(f"{server['base']}/api/v1/jobs/job-1/rollback", json={"epoch": 0},
                   headers=_auth(server["tokens"]["viewer"]), timeout=10)
    assert r.status_code == 403
    assert len(P.list_plans(engine, "job-1")) == before
