"""The body of ``PUT /jobs/{job}/policy`` and ``PUT /default-policy``: some settings of a
``RebalancePolicy``, each with its type and range, and no other key (the schema says so:
``additionalProperties: false``). The domain still checks everything (``RebalancePolicy``);
this states it in the OpenAPI document, where clients and schemathesis read it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from moeplane.controlplane.balancing import SEARCHES

Search = Literal[SEARCHES]  # type: ignore[valid-type] - the planner's searches, by name


class PolicyChanges(BaseModel):
    """Settings to change; those left out keep their value (see RebalancePolicy for units)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "manual"] | None = None
    imbalance_threshold: float | None = Field(default=None, ge=1.0, le=1e6, allow_inf_nan=False)
    sustain_steps: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1)
    min_interval_s: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    window_steps: StrictInt | None = Field(default=None, ge=1, le=2**31 - 1)
    horizon_steps: StrictInt | None = Field(default=None, ge=0, le=2**31 - 1)
    min_layer_gain: float | None = Field(default=None, ge=0, lt=10, allow_inf_nan=False)
    expert_bytes: StrictInt | None = Field(default=None, ge=0, le=2**62)
    intra_node_bytes_per_s: float | None = Field(default=None, ge=0, le=1e15, allow_inf_nan=False)
    cross_node_bytes_per_s: float | None = Field(default=None, ge=0, le=1e15, allow_inf_nan=False)
    moe_time_fraction: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    max_moves: StrictInt | None = Field(default=None, ge=0, le=2**31 - 1, description="null: the planner's choice")
    search: Search | None = None
    plan_timeout_s: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)

    def changes(self) -> dict:
        """The settings given (``max_moves: null`` included), for ``RebalancePolicy.updated``.
        Any other null means "leave it" and is dropped."""
        given = self.model_dump(exclude_unset=True)
        return {k: v for k, v in given.items() if v is not None or k == "max_moves"}
