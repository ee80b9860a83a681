"""Rebalancing policy of a job: mode and thresholds, validated, JSON round-trippable."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum

from moeplane.controlplane.balancing import SEARCHES
from moeplane.controlplane.domain.bounds import MAX_INT, MAX_INT32, Bound, check_all

BOUNDS = {  # each numeric setting's range (units: RebalancePolicy)
    "imbalance_threshold": Bound(ge=1.0, le=1e6),
    "sustain_steps": Bound(ge=1, le=MAX_INT32, integer=True),
    "min_interval_s": Bound(ge=0, le=1e9),
    "window_steps": Bound(ge=1, le=MAX_INT32, integer=True),
    "horizon_steps": Bound(ge=0, le=MAX_INT32, integer=True),
    "min_layer_gain": Bound(ge=0, lt=10),
    "expert_bytes": Bound(ge=0, le=MAX_INT, integer=True),
    "intra_node_bytes_per_s": Bound(ge=0, le=1e15),
    "cross_node_bytes_per_s": Bound(ge=0, le=1e15),
    "moe_time_fraction": Bound(gt=0, le=1),
    "max_moves": Bound(ge=0, le=MAX_INT32, integer=True),  # or None: the planner's choice
    "plan_timeout_s": Bound(ge=0, le=1e9),
}


class Mode(StrEnum):
    AUTO = "auto"  # plans are pushed to agents without a human
    MANUAL = "manual"  # an operator approves each plan through REST


@dataclass(frozen=True)
class RebalancePolicy:
    """Thresholds of the controller.

    imbalance_threshold: mean balancedness (max/mean rank load, 1.0 = perfect) above which
        the placement is considered imbalanced.
    sustain_steps: that many consecutive recent steps must be imbalanced.
    min_interval_s: least seconds between two plans of a job.
    window_steps: steps of history the prediction uses.
    horizon_steps: steps a new placement is expected to serve (the gain is counted over them).
    min_layer_gain: a layer moves only if its balancedness drops by at least this much.
    expert_bytes: bytes moved per expert copy (weights + optimizer state).
    intra_node_bytes_per_s, cross_node_bytes_per_s: link bandwidth per rank.
    moe_time_fraction: share of a step spent in expert compute (scales with max rank load).
    max_moves: most expert copies moved per plan (None: planner's choice).
    search: the planner's incremental search, "repair" (default) or "relieve" (the most
        loaded GPUs first: more moves for the same balance; ``plan_placement``).
    plan_timeout_s: a pushed plan not applied by then is marked failed.
    """

    mode: Mode = Mode.AUTO
    imbalance_threshold: float = 1.10
    sustain_steps: int = 3
    min_interval_s: float = 10.0
    window_steps: int = 20
    horizon_steps: int = 500
    min_layer_gain: float = 0.02
    expert_bytes: int = 64 * 1024 * 1024
    intra_node_bytes_per_s: float = 100e9
    cross_node_bytes_per_s: float = 25e9
    moe_time_fraction: float = 0.5
    max_moves: int | None = None
    search: str = "repair"
    plan_timeout_s: float = 120.0

    def __post_init__(self):
        if not isinstance(self.mode, Mode):
            try:
                object.__setattr__(self, "mode", Mode(self.mode))
            except ValueError:
                raise ValueError(f"mode: must be 'auto' or 'manual', got {self.mode!r}") from None
        check_all(self, BOUNDS, nullable=frozenset({"max_moves"}))
        if self.search not in SEARCHES:
            raise ValueError(f"search: must be one of {', '.join(SEARCHES)}, got {self.search!r}")

    def to_json(self) -> str:
        d = asdict(self)
        d["mode"] = str(self.mode)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RebalancePolicy:
        return cls.from_dict(json.loads(text or "{}"))

    @classmethod
    def from_dict(cls, data: dict) -> RebalancePolicy:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown policy setting (known: {', '.join(sorted(known))})")
        return cls(**data)

    def updated(self, **changes) -> RebalancePolicy:
        known = {f.name for f in fields(self)}
        for k in changes:
            if k not in known:
                raise ValueError(f"{k}: unknown policy setting")
        return replace(self, **changes)
