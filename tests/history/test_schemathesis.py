"""OpenAPI matches behaviour: schemathesis generates requests for every operation of the live
server (with history data in it), valid and invalid, and checks responses: no 5xx, documented
status codes, content types and headers, bodies valid against their schemas, invalid input
rejected."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
MAX_EXAMPLES = 30


def _fuzz(strategy, checks) -> None:
    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(checks=checks, timeout=30)

    run()


@pytest.mark.slow
def test_api_conforms_to_its_openapi(live):
    schema = schemathesis.openapi.from_url(f"{live['base']}/openapi.json")
    failures, operations = {}, 0
    for result in schema.get_all_operations():
        op = result.ok()
        operations += 1
        for mode, checks in ((GenerationMode.POSITIVE, CHECKS),
                             (GenerationMode.NEGATIVE, [*CHECKS, negative_data_rejection])):

            try:
                _fuzz(op.as_strategy(generation_mode=mode), checks)
            except Unsatisfiable:
                # no parameters or body: nothing invalid can be generated for this operation
                assert mode is GenerationMode.NEGATIVE, op.label
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collect all, report all
                failures[f"{op.label} ({mode.value})"] = f"{type(exc).__name__}: {exc}"[:3000]
    assert operations >= 30
    assert not failures, "\n\n".join(f"{k}\n{v}" for k, v in failures.items())
