"""Hand-made REST input gets a 4xx naming the parameter, never a 500 (issue 33, items 6, 12):
every integer or number parameter of every operation, at values past what the store holds,
on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import httpx
import pytest

from tests import aio
from tests.auth.streams import first_reply
from tests.controlplane.serverthread import running_server

ODD = ["9223372036854775808", "1e30", "-1", "18446744073709551616", "NaN", "inf"]


@pytest.fixture
def srv(database_url):
    with running_server(database_url) as info:
        assert aio.run(first_reply(info["grpc_port"], "node-0"))[0] == "ok"  # job-1 exists
        with httpx.Client(base_url=f"http://127.0.0.1:{info['http_port']}", timeout=30) as http:
            info["http"] = http
            yield info


def _number_params(doc: dict):
    """(method, path template, {path param: type}, [query params of type integer or number])."""
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            params = op.get("parameters", [])
            types = {p["name"]: (p["schema"].get("type") or
                                 next((a.get("type") for a in p["schema"].get("anyOf", []) if a.get("type") != "null"), None))
                     for p in params}
            in_path = {p["name"]: types[p["name"]] for p in params if p["in"] == "path"}
            numbers = [p["name"] for p in params if p["in"] == "query" and types[p["name"]] in ("integer", "number")]
            yield method, path, in_path, numbers


def _fill(path: str, in_path: dict, odd: str | None) -> str:
    def value(m):
        kind = in_path.get(m.group(1))
        if kind in ("integer", "number"):
            return odd or "1"
        return {"job_id": "job-1", "node_id": "node-0", "device_id": "node-0/gpu0"}.get(m.group(1), "x")
    return re.sub(r"\{(\w+)\}", value, path)


def test_no_number_reaches_a_500(srv):
    http = srv["http"]
    doc = http.get("/openapi.json").json()
    tried = 0
    for method, path, in_path, numbers in _number_params(doc):
        if method not in ("get", "delete") or (method == "delete" and not in_path):
            continue
        for odd in ODD:
            calls = [(_fill(path, in_path, odd), {})] if any(t in ("integer", "number") for t in in_path.values()) else []
            calls += [(_fill(path, in_path, None), {name: odd}) for name in numbers]
            for url, params in calls:
                if method == "delete" and "tokens" not in url and "claims" not in url:
                    continue
                r = http.request(method.upper(), url, params=params)
                tried += 1
                assert r.status_code < 500, f"{method.upper()} {url} {params} -> {r.status_code} {r.text[:200]}"
    assert tried > 100  # the schema was walked, not skipped


def test_step_past_int64_is_a_422_naming_it(srv):
    r = srv["http"].get("/api/v1/jobs/job-1/steps", params={"step_start": "9223372036854775808"})
    assert r.status_code == 422 and "step_start" in r.text
    r = srv["http"].get("/api/v1/jobs/job-1/loads", params={"step_end": "1e30"})
    assert r.status_code == 422 and "step_end" in r.text


@pytest.mark.parametrize("epoch", [False, True, "1", 1.0, None])
def test_rollback_epoch_is_a_strict_integer(srv, epoch):
    r = srv["http"].post("/api/v1/jobs/job-1/rollback", json={"epoch": epoch})
    assert r.status_code == 422 and "epoch" in r.text, r.text


def test_the_policy_body_states_its_keys_and_refuses_others(srv):
    http = srv["http"]
    doc = http.get("/openapi.json").json()
    body = doc["paths"]["/api/v1/jobs/{job_id}/policy"]["put"]["requestBody"]["content"]["application/json"]["schema"]
    schema = doc["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert schema["additionalProperties"] is False and {"mode", "max_moves", "search"} <= set(schema["properties"])
    r = http.put("/api/v1/jobs/job-1/policy", json={"nope": 1})
    assert r.status_code == 422 and "nope" in r.text
    assert http.put("/api/v1/jobs/job-1/policy", json={"sustain_steps": True}).status_code == 422
    r = http.put("/api/v1/jobs/job-1/policy", json={"mode": "manual", "max_moves": None})
    assert r.status_code == 200 and r.json()["mode"] == "manual" and r.json()["max_moves"] is None
