"""REST bodies: a caller without a valid token is refused before its body is read, and a body
past the bound gets 413, while the largest legitimate plan still fits (issue 33, item 7).
Real uvicorn over a socket; the body is never sent, so only an answer given before reading it
can arrive."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from moeplane.controlplane.auth.tokens import Role, TokenStore
from tests.controlplane.serverthread import running_server

NINETY_MB = 90 * 1024 * 1024


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with running_server(f"sqlite:///{tmp_path_factory.mktemp('bodies') / 'b.sqlite'}", auth=True) as info:
        store = TokenStore(info["engine"])
        info["operator"] = store.create(Role.OPERATOR).secret
        yield info


def answer_without_body(port: int, path: str, token: str | None, length: int) -> int:
    """POST ``path`` announcing ``length`` bytes of JSON but sending none; the status line."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            f"Content-Length: {length}"] + ([f"Authorization: Bearer {token}"] if token else [])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        status = sock.makefile("rb").readline().decode()  # times out if the server waits for the body
    return int(status.split()[1])


def test_no_token_is_refused_before_the_body(srv):
    assert answer_without_body(srv["http_port"], "/api/v1/jobs/job-1/rollback", None, NINETY_MB) == 401
    assert answer_without_body(srv["http_port"], "/api/v1/jobs/job-1/rollback", "mp_unknown", NINETY_MB) == 401


def test_a_body_past_the_bound_is_413(srv):
    assert answer_without_body(srv["http_port"], "/api/v1/jobs/job-1/rollback", srv["operator"], NINETY_MB) == 413
    with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=60) as http:
        chunks = (b" " * (1 << 20) for _ in range(10))  # chunked: no Content-Length to refuse on
        r = http.post("/jobs/job-1/rollback", content=chunks,
                      headers={"Authorization": f"Bearer {srv['operator']}", "Content-Type": "application/json"})
        assert r.status_code == 413


def test_the_largest_plan_fits(srv):
    phy2log = [[10_000 + (7 * s + layer) % 50_000 for s in range(8192)] for layer in range(58)]
    body = json.dumps({"phy2log": phy2log})  # 5-digit ids, ", " separators: about 3.3 MB
    assert len(body) > 3_000_000
    with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=60) as http:
        r = http.post("/jobs/job-1/placement", content=body,
                      headers={"Authorization": f"Bearer {srv['operator']}", "Content-Type": "application/json"})
    assert r.status_code not in (413, 500) and r.status_code in (404, 409, 422), r.text[:200]


def test_a_request_with_a_body_looks_its_token_up_once_and_its_role_is_still_checked(srv, monkeypatch):
    """BodyGuard authenticates before the body; ``authorize`` checks the route's role with the
    caller it found (one token-store lookup, counted in the server's thread) and still refuses a
    role below the route's."""
    lookups = []
    authenticate = TokenStore.authenticate

    def counted(self, secret):
        lookups.append(secret)
        return authenticate(self, secret)

    monkeypatch.setattr(TokenStore, "authenticate", counted)
    viewer = TokenStore(srv["engine"]).create(Role.VIEWER).secret
    lookups.clear()
    with httpx.Client(base_url=f"http://127.0.0.1:{srv['http_port']}/api/v1", timeout=30) as http:
        r = http.post("/jobs/job-1/rollback", json={}, headers={"Authorization": f"Bearer {srv['operator']}"})
        assert r.status_code not in (401, 403, 500), r.text
        assert lookups == [srv["operator"]]
        r = http.post("/jobs/job-1/rollback", json={}, headers={"Authorization": f"Bearer {viewer}"})
        assert r.status_code == 403 and "needs operator" in r.json()["detail"], r.text
        assert lookups == [srv["operator"], viewer]
        assert http.get("/jobs", headers={"Authorization": f"Bearer {viewer}"}).status_code == 200
        assert lookups == [srv["operator"], viewer, viewer]  # no body: authorize looks it up
