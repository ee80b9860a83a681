"""The bodies of ``PUT /jobs/{job}/policy`` and ``PUT /default-policy`` (some settings of a
``RebalancePolicy``) and of ``PUT /jobs/{job}/offload/policy`` (of an ``OffloadPolicy``): each
setting with its type and range, and no other key (the schema says so:
``additionalProperties: false``); a number is a JSON number (``true`` or ``"0.5"`` gets 422).
The ranges are the domain's own (``BOUNDS`` beside ``RebalancePolicy`` and ``OffloadPolicy``,
which check them on every way in); here they are stated in the OpenAPI document, where clients
and schemathesis read them."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from moeplane.controlplane.balancing import SEARCHES
from moeplane.controlplane.domain.bounds import Bound
from moeplane.controlplane.domain.offload_policy import BOUNDS as OFFLOAD
from moeplane.controlplane.domain.rebalance_policy import BOUNDS as REBALANCE

Search = Literal[SEARCHES]  # type: ignore[valid-type] - the planner's searches, by name
ModeName = Literal["auto", "manual"]  # the policies' Mode, by name


class _Changes(BaseModel):
    """Settings of a policy to change: no other key; those left out, or null unless named in
    ``NULLABLE``, keep their value."""

    model_config = ConfigDict(extra="forbid")
    NULLABLE: ClassVar[frozenset[str]] = frozenset()

    def changes(self) -> dict:
        """The settings given, for the policy's ``updated`` (a null only where ``NULLABLE``)."""
        given = self.model_dump(exclude_unset=True)
        return {k: v for k, v in given.items() if v is not None or k in self.NULLABLE}


def _ranged(bound: Bound, **kw):
    """A setting's ``Field``: absent by default, within ``bound`` (the domain's own range)."""
    return Field(default=None, **bound.limits(), **({} if bound.integer else {"allow_inf_nan": False}), **kw)


class PolicyChanges(_Changes):
    """Settings to change; those left out keep their value (see RebalancePolicy for units)."""

    NULLABLE = frozenset({"max_moves"})  # null: the planner's choice; any other null: leave it

    mode: ModeName | None = None
    imbalance_threshold: StrictFloat | None = _ranged(REBALANCE["imbalance_threshold"])
    sustain_steps: StrictInt | None = _ranged(REBALANCE["sustain_steps"])
    min_interval_s: StrictFloat | None = _ranged(REBALANCE["min_interval_s"])
    window_steps: StrictInt | None = _ranged(REBALANCE["window_steps"])
    horizon_steps: StrictInt | None = _ranged(REBALANCE["horizon_steps"])
    min_layer_gain: StrictFloat | None = _ranged(REBALANCE["min_layer_gain"])
    expert_bytes: StrictInt | None = _ranged(REBALANCE["expert_bytes"])
    intra_node_bytes_per_s: StrictFloat | None = _ranged(REBALANCE["intra_node_bytes_per_s"])
    cross_node_bytes_per_s: StrictFloat | None = _ranged(REBALANCE["cross_node_bytes_per_s"])
    moe_time_fraction: StrictFloat | None = _ranged(REBALANCE["moe_time_fraction"])
    max_moves: StrictInt | None = _ranged(REBALANCE["max_moves"], description="null: the planner's choice")
    search: Search | None = None
    plan_timeout_s: StrictFloat | None = _ranged(REBALANCE["plan_timeout_s"])


class OffloadPolicyChanges(_Changes):
    """Settings of a job's memory-offload policy to change (see OffloadPolicy); those left
    out, or null, keep their value."""

    mode: ModeName | None = None
    high_watermark: StrictFloat | None = _ranged(OFFLOAD["high_watermark"],
                                                 description="fraction of each device's capacity")
    low_watermark: StrictFloat | None = _ranged(
        OFFLOAD["low_watermark"], description="fraction of each device's capacity, below high_watermark")
    decision_timeout_s: StrictFloat | None = _ranged(OFFLOAD["decision_timeout_s"])
