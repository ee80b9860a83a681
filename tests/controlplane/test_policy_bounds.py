"""Each numeric policy setting's range is written once (``BOUNDS`` beside each policy): the
dataclass refuses a value past either end, naming the setting, and the REST body's schema states
the same ends."""

from __future__ import annotations

import math
import re

import pytest

from moeplane.controlplane.api.policy import OffloadPolicyChanges, PolicyChanges
from moeplane.controlplane.domain import offload_policy, rebalance_policy
from moeplane.controlplane.domain.offload_policy import OffloadPolicy
from moeplane.controlplane.domain.rebalance_policy import RebalancePolicy

CASES = [(RebalancePolicy, rebalance_policy.BOUNDS, PolicyChanges),
         (OffloadPolicy, offload_policy.BOUNDS, OffloadPolicyChanges)]
SETTINGS = [(cls, name, bound, body) for cls, bounds, body in CASES for name, bound in bounds.items()]


def _outside(bound) -> list:
    """Values just past each end, a bool, a non-finite number, and a float for an integer."""
    out = [True, math.nan, math.inf]
    if bound.ge is not None:
        out.append(bound.ge - (1 if bound.integer else 1e-9))
    if bound.gt is not None:
        out.append(bound.gt)
    if bound.le is not None:
        out.append(bound.le + 1 if bound.integer else bound.le * 1.5)
    if bound.lt is not None:
        out.append(bound.lt)
    if bound.integer:
        out.append(float((bound.ge or bound.gt or 0) + 1))
    return out


@pytest.mark.parametrize(("cls", "name", "bound", "body"), SETTINGS, ids=[s[1] for s in SETTINGS])
def test_the_domain_refuses_each_value_outside_and_the_schema_states_the_same_ends(cls, name, bound, body):
    for v in _outside(bound):
        with pytest.raises(ValueError, match=rf"^{name}: must be .* got {re.escape(repr(v))}$"):
            cls(**{name: v})
    kinds = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    schema = next(a for a in body.model_json_schema()["properties"][name]["anyOf"] if a["type"] != "null")
    assert {kinds[k]: v for k, v in bound.limits().items()} == {k: schema[k] for k in kinds.values() if k in schema}
    assert schema["type"] == ("integer" if bound.integer else "number")


def test_the_defaults_are_inside_their_ranges():
    for cls, bounds, _ in CASES:
        for name, bound in bounds.items():
            default = getattr(cls(), name)
            assert default is None or bound.contains(default), (cls.__name__, name, default)
