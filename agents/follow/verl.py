"""verl's file logger (``trainer.logger=[console,file]``, ``VERL_FILE_LOGGER_PATH``): one JSON
record per step, ``{"step": N, "data": {...}}`` (newer versions add ``elapsed_seconds``).

What a record can tell: how long each stage of the step took on the driver (``timing_s/*``),
tokens (``perf/total_num_tokens``), the policy version and the staleness of the batch
(``fully_async/*``, ``training/off_policy/*``). What it cannot: which device did what, or when
within the step. So each record becomes spans of rank -1 (the job, not a device), laid end to
end in verl's stage order and ending when the record was read (or at ``elapsed_seconds`` after
the first record); the idle analysis leaves rank -1 out. In fully-async mode ``timing_s/gen`` is
the rollouter's, running beside the trainer: it becomes a ``rollout`` span from the step's start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from moeplane.controlplane.wire import moeplane_pb2 as pb

# verl 0.9.1 ray_trainer / fully_async timer names -> phase, in the order a step runs them
STAGES = (
    ("timing_s/wait_for_enough_samples", "wait"),
    ("timing_s/gen", "generate"),
    ("timing_s/reward", "reward"),
    ("timing_s/old_log_prob", "logprob_old"),
    ("timing_s/ref", "logprob_ref"),
    ("timing_s/values", "values"),
    ("timing_s/adv", "advantage"),
    ("timing_s/update_critic", "train_update"),
    ("timing_s/update_actor", "train_update"),
    ("timing_s/update_weights", "weight_sync"),
    ("timing_s/param_sync", "weight_sync"),
    ("timing_s/save_checkpoint", "checkpoint"),
    ("timing_s/testing", "validate"),
)
SYNC_KEYS = ("timing_s/update_weights", "timing_s/param_sync")


@dataclass
class VerlStep:
    """Spans as rows (step, rank, version, phase, role, start, end, tokens) and the step's
    weight sync and consumed batch."""

    spans: list[tuple] = field(default_factory=list)
    syncs: list[pb.WeightSync] = field(default_factory=list)
    batches: list[pb.ConsumedBatch] = field(default_factory=list)


def _num(data: dict, key: str) -> float | None:
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{key}: {v!r} is not a number >= 0")
    return float(v)


class VerlRecords:
    """Turns record lines into :class:`VerlStep`; keeps the wall-clock anchor of
    ``elapsed_seconds``."""

    def __init__(self):
        self._anchor: float | None = None  # unix time of elapsed_seconds == 0

    def parse_many(self, lines: list[bytes], read_time: float) -> tuple[list[VerlStep], list[tuple[int, str]]]:
        """Records read together: the last ends at ``read_time`` and each earlier one where the
        next began (records without ``elapsed_seconds``). Returns the steps and (index, error)
        of each malformed line."""
        walls: list[float | None] = []
        errors: list[tuple[int, str]] = []
        for i, line in enumerate(lines):
            try:
                walls.append(self._wall(json.loads(line)))
            except ValueError as exc:
                walls.append(None)
                errors.append((i, str(exc)))
        steps: list[VerlStep] = []
        end = read_time
        for i in reversed(range(len(lines))):
            if walls[i] is None:
                continue
            try:
                steps.append(self.parse(lines[i], end))
            except ValueError as exc:
                errors.append((i, str(exc)))
                continue
            end -= walls[i]
        return steps[::-1], sorted(errors)

    def _wall(self, rec) -> float:
        if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict):
            raise ValueError("not a {'step': N, 'data': {...}} record")
        data = rec["data"]
        asynchronous = any(k.startswith("fully_async/") for k in data)
        known = sum(d for key, _p in STAGES if (d := _num(data, key)) and not (asynchronous and key == "timing_s/gen"))
        return _num(data, "timing_s/step") or known

    def parse(self, line: bytes | str, read_time: float) -> VerlStep:
        """One record ending at ``read_time`` (unless it has ``elapsed_seconds``); raises
        ValueError naming what is malformed."""
        rec = json.loads(line)
        if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict):
            raise ValueError("not a {'step': N, 'data': {...}} record")
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step: {step!r} is not an integer >= 0")
        data = rec["data"]
        end = read_time
        elapsed = rec.get("elapsed_seconds")
        if isinstance(elapsed, int | float) and not isinstance(elapsed, bool) and math.isfinite(elapsed):
            if self._anchor is None:
                self._anchor = read_time - elapsed
            end = self._anchor + elapsed
        timers = [(key, phase, _num(data, key)) for key, phase in STAGES]
        asynchronous = any(k.startswith("fully_async/") for k in data)
        start = end - self._wall(rec)
        version_v = _num(data, "fully_async/count/current_param_version")
        version = int(version_v) if version_v is not None else max(step - 1, 0)
        tokens = int(_num(data, "perf/total_num_tokens") or 0)
        out = VerlStep()
        role = "trainer" if asynchronous else "hybrid"
        t = start
        for key, phase, seconds in timers:
            if not seconds:
                continue
            if asynchronous and key == "timing_s/gen":
                out.spans.append((step, -1, version, phase, "rollout", start, min(start + seconds, end), tokens))
                continue
            out.spans.append((step, -1, version, phase, role, t, t + seconds, tokens if phase == "generate" else 0))
            if key in SYNC_KEYS:
                out.syncs.append(pb.WeightSync(step=step, rank=-1, from_version=version, to_version=version + 1,
                                               start=t, transfer_s=seconds))
            t += seconds
        lag = [_num(data, f"training/off_policy/trajectory_staleness/{s}") for s in ("min", "mean", "max")]
        dropped = _num(data, "fully_async/count/dropped_stale_samples")
        partial = _num(data, "fully_async/partial/total_partial_num")
        if any(x is not None for x in (*lag, dropped, partial)):
            lo, mean, hi = (x or 0.0 for x in lag)
            out.batches.append(pb.ConsumedBatch(
                step=step, rank=-1, trained_version=version, lag_min=int(lo), lag_mean=mean,
                lag_max=int(math.ceil(hi)), bound=-1, dropped=int(dropped or 0), partial=int(partial or 0),
                timestamp=end))
        return out
