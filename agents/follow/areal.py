"""AReaL's perf tracer (``perf_tracer.enabled``): Chrome-trace events, one JSON object per
line, in ``traces-r{rank}.jsonl`` (under a role folder when the tracer has one).

What an event can tell: a rank's own interval in one named scope of a step (``ts``/``dur`` in
microseconds, ``args.rank``, ``args.global_step``) — a real per-device span. What it cannot:
wall-clock time (``ts`` counts from the tracer's start, a ``perf_counter``): the follower anchors
all files of a directory to the wall clock once, at its first read, so spans are exact relative
to each other (when the ranks' tracers started together) and within a save interval in absolute
time. The trainer-side ``train.rollout`` scope is generation in a colocated run, but waiting for
samples in an asynchronous one; it is mapped to ``generate``. ``version_stats/*`` goes to AReaL's
stats logger (wandb, tensorboard, the console), not to these files, and is not captured.
"""

from __future__ import annotations

import json
import math
import re

# AReaL 1.0.4 trainer scope names (areal/trainer/rl_trainer.py) -> phase
SCOPES = {
    "train.rollout": "generate",
    "train.recompute_logp": "logprob_old",
    "train.ref_logp": "logprob_ref",
    "train.teacher_logp": "logprob_ref",
    "train.compute_values": "values",
    "train.compute_advantage": "advantage",
    "train.ppo_update": "train_update",
    "train.critic_ppo_update": "train_update",
    "train.update_weights": "weight_sync",
    "train.rollout_pause": "weight_sync",
    "train.rollout_pause_generation": "weight_sync",
    "train.rollout_resume": "weight_sync",
    "train.rollout_continue_generation": "weight_sync",
    "train.rollout_offload": "offload",
    "train.rollout_onload": "onload",
    "train.save": "checkpoint",
    "train.checkpoint": "checkpoint",
    "train.eval": "validate",
}
RANK_FILE = re.compile(r"traces-r(\d+)\.jsonl$")


def parse_event(line: bytes | str, file_rank: int | None) -> tuple | None:
    """A complete event (``ph: "X"``) of a mapped scope as (step, rank, version, phase,
    start_us, end_us, tokens); None for metadata, instants and unmapped scopes. Raises
    ValueError naming what is malformed. The policy version is the global step."""
    ev = json.loads(line)
    if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
        raise ValueError("not a Chrome-trace event (no 'ph')")
    if ev["ph"] != "X" or ev.get("name") not in SCOPES:
        return None
    ts, dur, args = ev.get("ts"), ev.get("dur"), ev.get("args") or {}
    for key, v in (("ts", ts), ("dur", dur)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{key}: {v!r} is not a number >= 0")
    step = args.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"args.global_step: {step!r} is not an integer >= 0")
    rank = args.get("rank", file_rank)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"args.rank: {rank!r} is not an integer >= 0")
    return step, rank, step, SCOPES[ev["name"]], float(ts), float(ts + dur), 0
