"""Memory-offload policy of a job: mode and watermarks, validated, dict round-trippable."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from moeplane.controlplane.domain.bounds import Bound, check_all
from moeplane.controlplane.domain.rebalance_policy import Mode
from moeplane.controlplane.memory import WatermarkPolicy

BOUNDS = {  # each numeric setting's range (units: OffloadPolicy)
    "high_watermark": Bound(gt=0, le=1),
    "low_watermark": Bound(gt=0, lt=1),  # and below high_watermark
    "decision_timeout_s": Bound(gt=0, le=1e9),
}


@dataclass(frozen=True)
class OffloadPolicy:
    """How a job's offload controller acts.

    mode: ``auto`` pushes decisions to agents at once; ``manual`` waits for an operator.
    high_watermark, low_watermark: fractions of each device's capacity, ``0 < low < high <= 1``;
        over ``high`` actions are applied, under ``low`` they are relaxed.
    decision_timeout_s: a pushed decision not reported applied by then is marked failed.
    """

    mode: Mode = Mode.AUTO
    high_watermark: float = 0.90
    low_watermark: float = 0.70
    decision_timeout_s: float = 120.0

    def __post_init__(self):
        if not isinstance(self.mode, Mode):
            try:
                object.__setattr__(self, "mode", Mode(self.mode))
            except ValueError:
                raise ValueError(f"mode: must be 'auto' or 'manual', got {self.mode!r}") from None
        check_all(self, BOUNDS)
        if not self.low_watermark < self.high_watermark:
            raise ValueError(
                f"low_watermark: must be below high_watermark={self.high_watermark}, "
                f"got {self.low_watermark!r}"
            )

    @property
    def watermarks(self) -> WatermarkPolicy:
        return WatermarkPolicy(high_watermark=float(self.high_watermark),
                               low_watermark=float(self.low_watermark))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mode"] = str(self.mode)
        return d

    def updated(self, **changes) -> OffloadPolicy:
        known = {f.name for f in fields(self)}
        for k in changes:
            if k not in known:
                raise ValueError(f"{k}: unknown offload policy setting (known: {', '.join(sorted(known))})")
        return replace(self, **changes)
