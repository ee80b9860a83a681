"""The OpenAPI document states what the server refuses (issue 33, schemathesis ST202).

Schemathesis' ``positive_data_acceptance`` check (ST202, "schema-valid request rejected") sends
requests that the document calls valid and fails on a 4xx other than 401/403/404/409/429. A
422 is expected only from an operation whose document states the rule across fields that it
enforces (``x-rules``, listed again in the 422 response's description). Bounds that one field
can carry (``maximum``, ``additionalProperties: false``) are in the schema itself, so no valid
request breaks them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from moeplane.controlplane.api.rules import RULES_KEY
from tests import aio
from tests.auth.streams import first_reply
from tests.controlplane.serverthread import running_server

ST = Path(sys.executable).with_name("st")
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # the check's defaults


def _get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.load(r)


def _document(port: int) -> dict:
    return _get(port, "/openapi.json")


def _stated(doc: dict) -> list[tuple[str, str, dict]]:
    """(path, method, operation) of every operation that states its rules (``x-rules``)."""
    return [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()
            if isinstance(op, dict) and op.get(RULES_KEY)]


def _config(doc: dict) -> str:
    """schemathesis.toml: 422 accepted on exactly the operations that state their rules."""
    lines = []
    for path, method, _op in _stated(doc):
        lines += ["[[operations]]", f"include-path = {json.dumps(path)}",
                  f"include-method = {json.dumps(method.upper())}",
                  f"checks.positive_data_acceptance.expected-statuses = {json.dumps(ACCEPTED + ['422'])}",
                  ""]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    with running_server(f"sqlite:///{tmp / 's.sqlite'}") as srv:
        assert aio.run(first_reply(srv["grpc_port"], "node-0"))[0] == "ok"  # job-1 exists
        yield srv | {"tmp": tmp}


def test_every_operation_that_refuses_a_valid_shape_states_why(server):
    doc = _document(server["http_port"])
    stated = _stated(doc)
    assert {(m, p) for p, m, _op in stated} >= {("put", "/api/v1/jobs/{job_id}/offload/policy"),
                                               ("get", "/api/v1/history/jobs/{job_id}/steps")}
    for _path, _method, op in stated:
        bad = op["responses"]["422"]["description"]
        assert all(rule in bad for rule in op[RULES_KEY])
    offload = doc["components"]["schemas"]["OffloadPolicyChanges"]
    assert offload["additionalProperties"] is False
    epoch = doc["components"]["schemas"]["RollbackRequest"]["properties"]["epoch"]
    assert epoch["maximum"] <= 2**53 - 1  # a bound a JSON number carries exactly


def _put(port: int, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="PUT", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize(("path", "body", "named"), [
    ("/api/v1/jobs/job-1/offload/policy", {"high_watermark": 0.8, "watermark": 0.5}, "watermark"),
    ("/api/v1/jobs/job-1/offload/policy", {"high_watermark": True}, "high_watermark"),
    ("/api/v1/jobs/job-1/offload/policy", {"decision_timeout_s": "60"}, "decision_timeout_s"),
    ("/api/v1/default-policy", {"moe_time_fraction": True}, "moe_time_fraction"),
])
def test_what_the_policy_schemas_refuse_is_refused_by_name(server, path, body, named):
    status, text = _put(server["http_port"], path, body)
    assert status == 422 and named in text, text
    policy = _get(server["http_port"], "/api/v1/jobs/job-1/offload/policy")
    assert policy["high_watermark"] == 0.9  # nothing of the refused body was applied


@pytest.mark.slow
def test_schemathesis_finds_no_valid_request_refused(server):
    config = server["tmp"] / "schemathesis.toml"
    config.write_text(_config(_document(server["http_port"])))
    run = subprocess.run(
        [str(ST), "--config-file", str(config), "run", f"http://127.0.0.1:{server['http_port']}/openapi.json",
         "--checks", "positive_data_acceptance", "--phases", "coverage,fuzzing", "--max-examples", "25",
         "--seed", "1", "--suppress-health-check", "all",
         "--no-color"],
        capture_output=True, text=True, timeout=600)
    tested = re.search(r"Tested: (\d+)", run.stdout)
    assert tested and int(tested.group(1)) >= 30, run.stdout[-6000:]  # the run did reach the operations
    assert "ST202" not in run.stdout, run.stdout[-6000:]
    assert run.returncode == 0, run.stdout[-6000:]
