"""The bodies of ``PUT /jobs/{job}/policy`` and ``PUT /default-policy`` (some settings of a
``RebalancePolicy``) and of ``PUT /jobs/{job}/offload/policy`` (of an ``OffloadPolicy``): each
setting with its type and range, and no other key (the schema says so:
``additionalProperties: false``); a number is a JSON number (``true`` or ``"0.5"`` gets 422).
The domain still checks everything (``RebalancePolicy``, ``OffloadPolicy``); this states it in
the OpenAPI document, where clients and schemathesis read it."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from moeplane.controlplane.api.deps import MAX_INT, MAX_INT32
from moeplane.controlplane.balancing import SEARCHES

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


class PolicyChanges(_Changes):
    """Settings to change; those left out keep their value (see RebalancePolicy for units)."""

    NULLABLE = frozenset({"max_moves"})  # null: the planner's choice; any other null: leave it

    mode: ModeName | None = None
    imbalance_threshold: StrictFloat | None = Field(default=None, ge=1.0, le=1e6, allow_inf_nan=False)
    sustain_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_INT32)
    min_interval_s: StrictFloat | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    window_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_INT32)
    horizon_steps: StrictInt | None = Field(default=None, ge=0, le=MAX_INT32)
    min_layer_gain: StrictFloat | None = Field(default=None, ge=0, lt=10, allow_inf_nan=False)
    expert_bytes: StrictInt | None = Field(default=None, ge=0, le=MAX_INT)
    intra_node_bytes_per_s: StrictFloat | None = Field(default=None, ge=0, le=1e15, allow_inf_nan=False)
    cross_node_bytes_per_s: StrictFloat | None = Field(default=None, ge=0, le=1e15, allow_inf_nan=False)
    moe_time_fraction: StrictFloat | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    max_moves: StrictInt | None = Field(default=None, ge=0, le=MAX_INT32, description="null: the planner's choice")
    search: Search | None = None
    plan_timeout_s: StrictFloat | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)


class OffloadPolicyChanges(_Changes):
    """Settings of a job's memory-offload policy to change (see OffloadPolicy); those left
    out, or null, keep their value."""

    mode: ModeName | None = None
    high_watermark: StrictFloat | None = Field(default=None, gt=0, le=1, allow_inf_nan=False,
                                         description="fraction of each device's capacity")
    low_watermark: StrictFloat | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False,
                                        description="fraction of each device's capacity, below high_watermark")
    decision_timeout_s: StrictFloat | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
