"""Idle ("black hole") analysis of RL post-training, computed from phase spans.

Each step's window is the job's: from the first span start to the last span end of that step
over every device. A device present in a step (it has a span in it) is charged the whole window:

    wall = productive + sync + switch + idle

- productive: the union of the device's productive spans (``phases.PRODUCTIVE``);
- sync: its ``weight_sync`` time outside productive time; switch: its ``offload``/``onload``
  time outside both (mode-switch overhead of a colocated device);
- idle: the rest (``wait`` spans count as idle: they are what the device says it waited for).

Idle is attributed to one cause per instant, first match in this order:

1. ``staleness_throttle``: inside the device's own ``wait`` span when it is a rollout device
   (held back by the staleness bound); ``starvation`` for any other role's ``wait``;
2. another device is generating: ``generation_tail`` when this device generated in this step
   (it finished its rollouts early), else ``starvation`` (waiting for samples);
3. any device is in ``weight_sync``: ``refit_bubble``;
4. any device is in ``offload``/``onload``: ``mode_switch``;
5. a rollout device while any device trains: ``staleness_throttle`` (waiting for new weights);
6. else ``other``.

Per job: the black-hole fraction (idle device-seconds / device-seconds), the tail ratio (per
step: max / median of the devices' generation time; the job's is the mean over steps), the sync
share (sync device-seconds / device-seconds) and a bottleneck class per step, the largest of the
job-wide union of generation, of trainer phases, and of weight sync plus offload/onload.
A framework's per-step timers (rank -1 spans) are not devices: they are left out here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.rl import intervals as iv
from moeplane.controlplane.rl.phases import (
    PHASE_CODE,
    PRODUCTIVE,
    ROLE_CODE,
    SWITCH,
    SYNC,
    TRAINER_PHASES,
    WAIT,
    Spans,
)

CAUSES = ("generation_tail", "starvation", "refit_bubble", "mode_switch", "staleness_throttle", "other")
BOTTLENECKS = ("rollout", "trainer", "sync")


def _codes(names) -> np.ndarray:
    return np.array(sorted(PHASE_CODE[n] for n in names), dtype=np.int8)


_PRODUCTIVE, _SYNC, _SWITCH, _WAIT = _codes(PRODUCTIVE), _codes(SYNC), _codes(SWITCH), _codes(WAIT)
_TRAIN, _GEN = _codes(TRAINER_PHASES), _codes(("generate",))
_ROLLOUT = ROLE_CODE["rollout"]


@dataclass(frozen=True)
class IdleReport:
    """Per (step, device) breakdown, seconds. S steps, D devices (ranks).

    steps int64 [S]; ranks int32 [D]; roles int8 [D] (each rank's role, its last one seen);
    window_start float64 [S] (unix s); wall float64 [S] (the step window, s);
    present bool [S, D]; productive, sync, switch, idle float64 [S, D];
    idle_cause float64 [S, D, len(CAUSES)]; generate float64 [S, D] (generation time);
    bottleneck int8 [S] (index into BOTTLENECKS, -1: no device span in the step).
    """

    steps: np.ndarray
    ranks: np.ndarray
    roles: np.ndarray
    window_start: np.ndarray
    wall: np.ndarray
    present: np.ndarray
    productive: np.ndarray
    sync: np.ndarray
    switch: np.ndarray
    idle: np.ndarray
    idle_cause: np.ndarray
    generate: np.ndarray
    bottleneck: np.ndarray

    def device_seconds(self) -> float:
        return float((self.wall[:, None] * self.present).sum())

    def summary(self) -> dict:
        """Per job: black_hole_fraction, tail_ratio (mean over steps with generation; also
        tail_ratio_max), sync_share, switch_share, idle seconds by cause, bottleneck (the class
        holding the most step wall time) and device_seconds."""
        total = self.device_seconds()
        tails = step_tail_ratios(self)
        tails = tails[np.isfinite(tails)]
        by_class = np.zeros(len(BOTTLENECKS))
        for b, w in zip(self.bottleneck, self.wall, strict=True):
            if b >= 0:
                by_class[b] += w
        return {
            "steps": int(self.steps.size),
            "devices": int(self.ranks.size),
            "device_seconds": total,
            "black_hole_fraction": float(self.idle.sum() / total) if total > 0 else 0.0,
            "tail_ratio": float(tails.mean()) if tails.size else None,
            "tail_ratio_max": float(tails.max()) if tails.size else None,
            "sync_share": float(self.sync.sum() / total) if total > 0 else 0.0,
            "switch_share": float(self.switch.sum() / total) if total > 0 else 0.0,
            "idle_by_cause_s": {c: float(self.idle_cause[:, :, i].sum()) for i, c in enumerate(CAUSES)},
            "bottleneck": BOTTLENECKS[int(by_class.argmax())] if by_class.any() else None,
        }


def step_tail_ratios(report: IdleReport) -> np.ndarray:
    """float64 [S]: max / median of the generating devices' generation time (NaN: none)."""
    out = np.full(report.steps.size, np.nan)
    for i in range(report.steps.size):
        g = report.generate[i][report.generate[i] > 0]
        if g.size:
            out[i] = g.max() / np.median(g)
    return out


def _class_union(spans: Spans, codes: np.ndarray, lo: float, hi: float):
    mask = np.isin(spans.phase, codes)
    return iv.union(spans.start[mask], spans.end[mask], lo, hi)


def analyze(spans: Spans) -> IdleReport:
    """Break every device's step time down as the module docstring says.

    ``spans``: the job's spans of the steps to analyze (whole steps: a step cut short reads as
    a shorter window). Rank -1 rows are ignored.
    """
    spans = spans.take(spans.rank >= 0)
    steps = np.unique(spans.step)
    ranks = np.unique(spans.rank)
    S, D = steps.size, ranks.size
    roles = np.zeros(D, dtype=np.int8)
    if len(spans):
        last = np.lexsort((spans.start, spans.rank))
        r_sorted = spans.rank[last]
        ends = np.append(np.flatnonzero(np.diff(r_sorted)), r_sorted.size - 1)
        roles[:] = spans.role[last][ends]
    out = {k: np.zeros((S, D)) for k in ("productive", "sync", "switch", "idle", "generate")}
    cause = np.zeros((S, D, len(CAUSES)))
    present = np.zeros((S, D), dtype=bool)
    window_start, wall = np.zeros(S), np.zeros(S)
    bottleneck = np.full(S, -1, dtype=np.int8)
    step_of = np.searchsorted(steps, spans.step)
    dev_of = np.searchsorted(ranks, spans.rank)
    order = np.lexsort((dev_of, step_of))
    bounds = np.flatnonzero(np.diff(step_of[order])) + 1
    for rows in np.split(order, bounds) if len(spans) else []:
        si = int(step_of[rows[0]])
        step = spans.take(rows)
        lo, hi = float(step.start.min()), float(step.end.max())
        window_start[si], wall[si] = lo, hi - lo
        gen_all = _class_union(step, _GEN, lo, hi)
        train_all = _class_union(step, _TRAIN, lo, hi)
        sync_all = _class_union(step, _SYNC, lo, hi)
        switch_all = _class_union(step, _SWITCH, lo, hi)
        sw_or_sync = iv.union(np.concatenate([sync_all[0], switch_all[0]]),
                              np.concatenate([sync_all[1], switch_all[1]]))
        bottleneck[si] = int(np.argmax([iv.length(gen_all), iv.length(train_all), iv.length(sw_or_sync)]))
        _step_devices(step, dev_of[rows], lo, hi, (gen_all, train_all, sync_all, switch_all), roles, out, cause,
                      present, si)
    return IdleReport(steps, ranks.astype(np.int32), roles, window_start, wall, present,
                      out["productive"], out["sync"], out["switch"], out["idle"], cause,
                      out["generate"], bottleneck)


def _own_cover(step: Spans, key0: np.ndarray, rel_s: np.ndarray, rel_e: np.ndarray, codes: np.ndarray,
               mid: np.ndarray) -> np.ndarray:
    """bool [K]: whether each segment midpoint (a device key, see ``_step_devices``) lies in one of
    that device's spans of a phase in ``codes``."""
    m = np.isin(step.phase, codes)
    starts, ends = np.sort(key0[m] + rel_s[m]), np.sort(key0[m] + rel_e[m])
    return (np.searchsorted(starts, mid, side="right") - np.searchsorted(ends, mid, side="right")) > 0


def _step_devices(step: Spans, devs: np.ndarray, lo: float, hi: float, unions, roles: np.ndarray, out: dict,
                  cause: np.ndarray, present: np.ndarray, si: int) -> None:
    """Every device of one step at once. Device ``d``'s window [lo, hi) is laid at key offset
    ``d * W`` (W = wall + 1 s) so that one sorted array of boundaries holds every device's
    elementary segments: its own span edges and the job-wide class unions' edges."""
    wall = hi - lo
    width_key = wall + 1.0
    key0 = devs.astype(np.float64) * width_key
    rel_s, rel_e = np.clip(step.start - lo, 0, wall), np.clip(step.end - lo, 0, wall)
    here = np.unique(devs)
    present[si, here] = True
    job_edges = np.concatenate([np.array([0.0, wall])] + [np.concatenate(u) - lo for u in unions])
    keys = np.unique(np.concatenate([key0 + rel_s, key0 + rel_e,
                                     (here.astype(np.float64) * width_key)[:, None].repeat(job_edges.size, 1).ravel()
                                     + np.tile(np.clip(job_edges, 0, wall), here.size)]))
    seg_dev = np.floor(keys[:-1] / width_key).astype(np.int64)
    offset = keys[:-1] - seg_dev * width_key
    keep = offset < wall  # not the gap between one device's window end and the next one's start
    left, right, seg_dev = keys[:-1][keep], keys[1:][keep], seg_dev[keep]
    width, mid = right - left, (left + right) / 2
    mid_t = mid - seg_dev * width_key + lo  # back to unix seconds for the job-wide unions
    own = {name: _own_cover(step, key0, rel_s, rel_e, codes, mid)
           for name, codes in (("prod", _PRODUCTIVE), ("sync", _SYNC), ("switch", _SWITCH), ("wait", _WAIT),
                               ("gen", _GEN))}
    in_prod = own["prod"]
    in_sync = own["sync"] & ~in_prod
    in_switch = own["switch"] & ~in_prod & ~in_sync
    idle = ~(in_prod | in_sync | in_switch)
    D = present.shape[1]

    def per_device(mask: np.ndarray) -> np.ndarray:
        return np.bincount(seg_dev[mask], weights=width[mask], minlength=D)

    out["productive"][si] += per_device(in_prod)
    out["sync"][si] += per_device(in_sync)
    out["switch"][si] += per_device(in_switch)
    out["idle"][si] += per_device(idle)
    gen_time = per_device(own["gen"])
    out["generate"][si] += gen_time
    generated = (gen_time > 0)[seg_dev]
    rollout = (roles == _ROLLOUT)[seg_dev]
    gen_all, train_all, sync_all, switch_all = unions
    c = {name: CAUSES.index(name) for name in CAUSES}
    rules = (
        (own["wait"], np.where(rollout, c["staleness_throttle"], c["starvation"])),
        (iv.covered(mid_t, gen_all), np.where(generated, c["generation_tail"], c["starvation"])),
        (iv.covered(mid_t, sync_all), c["refit_bubble"]),
        (iv.covered(mid_t, switch_all), c["mode_switch"]),
        (iv.covered(mid_t, train_all) & rollout, c["staleness_throttle"]),
        (np.ones(mid.shape, dtype=bool), c["other"]),
    )
    which = np.full(mid.shape, -1, dtype=np.int64)
    for hit, index in rules:
        take = idle & hit & (which < 0)
        which[take] = np.broadcast_to(index, mid.shape)[take]
    m = which >= 0
    cause[si] += np.bincount(seg_dev[m] * len(CAUSES) + which[m], weights=width[m],
                             minlength=D * len(CAUSES)).reshape(D, len(CAUSES))


def step_black_hole_fractions(report: IdleReport) -> np.ndarray:
    """float64 [S]: idle device-seconds / device-seconds of each step (NaN: no device)."""
    device_s = report.wall * report.present.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(device_s > 0, report.idle.sum(axis=1) / device_s, np.nan)


def black_hole_alert(fractions: np.ndarray, threshold: float, steps: int) -> bool:
    """The alert condition: each of the last ``steps`` steps' black-hole fraction (``fractions``
    [S], oldest first) is above ``threshold``."""
    if steps < 1:
        raise ValueError(f"steps: must be >= 1, got {steps}")
    last = fractions[-steps:]
    return bool(last.size == steps and np.all(last > threshold))
