"""The step range [start, end) an RL view reads, from what the user gave (pure): the rule
behind REST ``/rl/...?step_start=&step_end=`` and the RL page's step-range picker."""

from __future__ import annotations

DEFAULT_STEPS = 50  # steps read when the range gives only one end, or none
MAX_STEPS = 10_000  # widest range


def step_window(step_start: int | None, step_end: int | None, newest: int | None, *,
                default: int = DEFAULT_STEPS) -> tuple[int, int]:
    """[start, end) steps. Without an end: ``default`` steps from the start, or up to the
    ``newest`` stored step (None: nothing stored) when there is no start either; without a
    start: ``default`` steps before the end. Raises ValueError naming the bad bound for a
    negative start, an empty range or one wider than ``MAX_STEPS`` steps."""
    if step_start is not None and step_start < 0:
        raise ValueError(f"step_start: {step_start} is negative")
    if step_start is not None and step_end is not None and step_end <= step_start:
        raise ValueError(f"step_end: {step_end} must be above step_start {step_start}")
    if step_end is None:
        if step_start is not None:
            step_end = step_start + default
        else:
            step_end = 1 if newest is None else int(newest) + 1
    if step_start is None:
        step_start = max(0, step_end - default)
    if step_end - step_start > MAX_STEPS:
        raise ValueError(f"step_end: a range of {step_end - step_start} steps exceeds {MAX_STEPS}")
    return step_start, step_end


def newest_within(steps, counts, limit: int) -> int | None:
    """The first step of the newest run of ``steps`` (int [S], ascending) whose span ``counts``
    (int [S]) sum to at most ``limit``; the newest step alone when it holds more. None: no steps."""
    if len(steps) == 0:
        return None
    total, first = 0, int(steps[-1])
    for step, count in zip(reversed(list(steps)), reversed(list(counts)), strict=True):
        total += int(count)
        if total > limit and int(step) != int(steps[-1]):
            break
        first = int(step)
    return first
