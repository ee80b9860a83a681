"""Schemathesis, stateful, against ``serve --auth`` with an admin token: sequences of calls
that follow the links schemathesis infers between operations (create a token then revoke it,
read a plan then approve it, ...), for MOEPLANE_STATEFUL_S seconds (default 180; issue 33).
Every response must be below 500."""

from __future__ import annotations

import os
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from moeplane.controlplane.auth.tokens import Role, TokenStore
from tests import aio
from tests.auth.streams import first_reply
from tests.controlplane.serverthread import running_server

SECONDS = float(os.environ.get("MOEPLANE_STATEFUL_S", "180"))


@pytest.mark.slow
def test_stateful_run_has_no_server_error(tmp_path):
    with running_server(f"sqlite:///{tmp_path / 's.sqlite'}", auth=True) as srv:
        store = TokenStore(srv["engine"])
        admin = store.create(Role.ADMIN)
        node = store.create(Role.NODE, node_id="node-0").secret
        assert aio.run(first_reply(srv["grpc_port"], "node-0", node))[0] == "ok"  # job-1 exists
        schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{srv['http_port']}/openapi.json")
        errors: list[str] = []
        calls = [0]

        class Workflow(schema.as_state_machine()):
            def before_call(self, case):
                if case.path_parameters and case.path_parameters.get("token_id") == admin.principal.token_id:
                    case.path_parameters["token_id"] += 1  # keep the run's own token

            def get_call_kwargs(self, case):
                return {"headers": {"Authorization": f"Bearer {admin.secret}"}, "timeout": 30}

            def validate_response(self, response, case, additional_checks=None, **kwargs):
                calls[0] += 1
                if response.status_code >= 500:
                    errors.append(f"{case.method} {case.formatted_path} {case.query} -> "
                                  f"{response.status_code} {response.text[:300]}")

        deadline = time.monotonic() + SECONDS
        runs = 0
        while time.monotonic() < deadline:
            Workflow.run(settings=settings(max_examples=10, stateful_step_count=8, deadline=None,
                                           database=None, suppress_health_check=list(HealthCheck)))
            runs += 1
        assert calls[0] > 100, calls[0]  # the run did call the server
        assert not errors, "\n".join(errors[:20])
