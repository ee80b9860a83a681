"""Parsing the History page's range inputs into store ranges (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from moeplane.controlplane.store.queries import Range

HISTORY_STEPS = 50  # steps shown when no range is given
MAX_HISTORY_STEPS = 500  # load matrices decoded for one History view


def _time(text: str, name: str) -> float:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{name}: not an ISO 8601 time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _step(text: str, name: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name}: not a step number: {text!r}") from None


def history_range(kind: str, start: str | None, end: str | None, latest_step: int | None) -> Range:
    """The store range for the History page.

    ``kind`` is ``"steps"`` (inclusive step numbers) or ``"time"`` (ISO 8601, UTC unless an
    offset is given; the end is exclusive). Blank inputs mean the last ``HISTORY_STEPS`` steps
    up to ``latest_step``. At most ``MAX_HISTORY_STEPS`` steps are read.
    """
    start = (start or "").strip()
    end = (end or "").strip()
    if kind == "steps":
        s = _step(start, "from") if start else None
        e = _step(end, "to") + 1 if end else None
        if s is None and e is None and latest_step is not None:
            s, e = latest_step - HISTORY_STEPS + 1, latest_step + 1
        elif s is None and e is not None:
            s = e - HISTORY_STEPS
        if s is not None and e is not None and e <= s:
            raise ValueError("to: must not be before from")
        return Range(step_start=s, step_end=e, limit=MAX_HISTORY_STEPS)
    if kind == "time":
        t0 = _time(start, "from") if start else None
        t1 = _time(end, "to") if end else None
        if t0 is not None and t1 is not None and t1 <= t0:
            raise ValueError("to: must be after from")
        if t0 is None and t1 is None and latest_step is not None:
            return Range(step_start=latest_step - HISTORY_STEPS + 1, limit=MAX_HISTORY_STEPS)
        return Range(start=t0, end=t1, limit=MAX_HISTORY_STEPS)
    raise ValueError(f"kind: must be 'steps' or 'time', got {kind!r}")
