"""Rules across fields, stated in the OpenAPI document.

JSON Schema states what one field may hold (type, ``minimum``, ``maxLength``,
``additionalProperties: false``). Some requests are refused for a reason no single field shows:
a range whose end is not after its start, a plan whose shape is not the job's, a setting that
contradicts another. An operation that refuses such input says so with ``rules(...)`` as its
``openapi_extra``: the document then lists the rules under the operation's ``x-rules`` and in
the description of its 422 response (:func:`document_rules`). A client, or schemathesis'
``positive_data_acceptance`` check, can tell from the document alone which operations may
refuse a request whose every field is valid, and why.
"""

from __future__ import annotations

RULES_KEY = "x-rules"

# the rules shared by several operations, each written once
STEP_RANGE = "step_end must be after step_start"
RANGE = "end must not be before start, and step_end not before step_start"
JOB_SHAPE = "array shapes must match the job's geometry (layers, experts, ranks x slots per rank)"


def rules(*texts: str) -> dict:
    """``openapi_extra`` of an operation that refuses (422) input breaking one of ``texts``."""
    return {RULES_KEY: list(texts)}


def document_rules(doc: dict) -> dict:
    """Give every operation with ``x-rules`` a 422 response whose description lists them.
    ``doc``: an OpenAPI document, changed in place and returned."""
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            if not isinstance(op, dict) or not op.get(RULES_KEY):
                continue
            bad = op.setdefault("responses", {}).setdefault("422", {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
            bad["description"] = "a bad parameter, or a rule broken (the message names the field): " + "; ".join(op[RULES_KEY])
    return doc
