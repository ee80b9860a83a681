"""Field checks every decoder of a wire message shares; each raises WireError naming the field."""

from __future__ import annotations

import math
import re

from moeplane.controlplane.wire.arrays import WireError

MAX_ID = 128
CONTROL_CHARS = re.compile(r"[\x00-\x1f]")


def check_id(value: str, field: str, *, allow_empty: bool = False) -> str:
    """``value`` as an identifier: non-empty (unless ``allow_empty``), short, no control chars."""
    if not value and not allow_empty:
        raise WireError(field, "must not be empty")
    if len(value) > MAX_ID:
        raise WireError(field, f"longer than {MAX_ID} characters")
    if CONTROL_CHARS.search(value):
        raise WireError(field, "contains control characters")
    return value


def check_time(ts: float, field: str) -> float:
    """``ts`` as a finite, non-negative unix time in seconds."""
    if not math.isfinite(ts) or ts < 0:
        raise WireError(field, f"must be a finite unix time in seconds, got {ts}")
    return float(ts)
