"""A simulated RL post-training job: phase spans of every device, with the ground truth of its
idle time, for ``colocated``, ``one-step-off`` and ``async`` modes. Pure (numpy, a seed).

- colocated: every device is ``hybrid``: generate (each device's share of the batch; it waits
  for the slowest: the generation tail), offload, train, weight sync, onload.
- one-step-off / async: ``rollout`` devices generate batch k while ``trainer`` devices train
  batch k-1; batch k needs policy version >= k - K (K = ``staleness``; one-step-off: K = 1),
  else the rollouts wait (staleness throttle); the trainers wait for samples (starvation).
  One-step-off generates whole batches (the tail); async generates continuously (partial
  rollouts: no tail). Each weight sync pauses the rollouts (its time is sync, on every device).

Response lengths are lognormal (``tail_sigma``); a device's generation time is its tokens over
its batched decode rate, but never below its longest response at one sequence's decode rate.
Weight-sync time is bytes over bandwidth. Step k of a disaggregated job is the trainer's: from
the end of sync k-1 to the end of sync k; every span is cut at those boundaries and labelled
with the step it falls in. Waiting is recorded as ``wait`` spans so that every device's window
is covered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moeplane.controlplane.rl.idle import CAUSES
from moeplane.controlplane.rl.phases import Spans

MODES = ("colocated", "one-step-off", "async")


@dataclass(frozen=True)
class RLSimConfig:
    mode: str = "colocated"
    staleness: int = 1  # K, async only (one-step-off: 1; colocated: 0)
    devices: int = 8
    rollout_devices: int = 3  # of ``devices``, disaggregated modes
    steps: int = 12
    prompts_per_step: int = 512
    mean_response_tokens: float = 1500.0
    tail_sigma: float = 0.8  # of response lengths within a batch
    batch_sigma: float = 0.3  # of a batch's mean length (prompts differ in difficulty)
    gen_tokens_per_s: float = 6000.0  # per device, batched decoding
    decode_tokens_per_s: float = 150.0  # one sequence
    train_tokens_per_s: float = 4000.0  # per device
    weight_bytes: float = 16e9
    sync_bytes_per_s: float = 25e9
    switch_s: float = 3.0  # one offload or onload (colocated)
    seed: int = 0
    t0: float = 1.7e9


@dataclass(frozen=True)
class RLSim:
    """spans: every device's spans; truth_idle float64 [S, D, len(CAUSES)] (seconds, ranks
    0..D-1); wall float64 [S] (s); tokens_per_s: generated tokens over the run's wall time;
    lag int64 [S]: trained version minus the version that generated each step's batch."""

    spans: Spans
    truth_idle: np.ndarray
    wall: np.ndarray
    tokens_per_s: float
    lag: np.ndarray


def _gen_times(rng, cfg: RLSimConfig, devices: int, tail: bool) -> tuple[np.ndarray, float]:
    """Per-device generation seconds [devices] of one batch, and its tokens."""
    mu = np.log(cfg.mean_response_tokens) - cfg.tail_sigma ** 2 / 2 + rng.normal(0, cfg.batch_sigma)
    lengths = rng.lognormal(mu, cfg.tail_sigma, cfg.prompts_per_step)
    tokens = float(lengths.sum())
    if not tail:
        return np.full(devices, tokens / (devices * cfg.gen_tokens_per_s)), tokens
    share = np.array_split(rng.permutation(lengths), devices)
    return np.array([max(s.sum() / cfg.gen_tokens_per_s, s.max() / cfg.decode_tokens_per_s) for s in share]), tokens


def simulate(cfg: RLSimConfig) -> RLSim:
    if cfg.mode not in MODES:
        raise ValueError(f"mode: {cfg.mode!r} is not one of {', '.join(MODES)}")
    if cfg.staleness < 0:
        raise ValueError(f"staleness: {cfg.staleness} < 0")
    rng = np.random.default_rng(cfg.seed)
    return _colocated(cfg, rng) if cfg.mode == "colocated" else _disaggregated(cfg, rng)


def _colocated(cfg: RLSimConfig, rng) -> RLSim:
    D, S = cfg.devices, cfg.steps
    rows: list[tuple] = []
    truth = np.zeros((S, D, len(CAUSES)))
    wall = np.zeros(S)
    t, total = cfg.t0, 0.0
    sync_s = cfg.weight_bytes / cfg.sync_bytes_per_s / D  # resharding in place, spread over devices
    for k in range(S):
        gen, tokens = _gen_times(rng, cfg, D, tail=True)
        total += tokens
        ge = t + gen.max()
        train = tokens / (D * cfg.train_tokens_per_s)
        for d in range(D):
            per = int(tokens / D)
            rows.append((k, d, k, "generate", "hybrid", t, t + gen[d], per))
            rows += [(k, d, k, "offload", "hybrid", ge, ge + cfg.switch_s, 0),
                     (k, d, k, "train_update", "hybrid", ge + cfg.switch_s, ge + cfg.switch_s + train, 0),
                     (k, d, k, "weight_sync", "hybrid", ge + cfg.switch_s + train, ge + cfg.switch_s + train + sync_s, 0),
                     (k, d, k, "onload", "hybrid", ge + cfg.switch_s + train + sync_s,
                      ge + 2 * cfg.switch_s + train + sync_s, 0)]
            truth[k, d, CAUSES.index("generation_tail")] = gen.max() - gen[d]
        end = ge + 2 * cfg.switch_s + train + sync_s
        wall[k], t = end - t, end
    return RLSim(Spans.build(*zip(*rows, strict=True)), truth, wall, total / (t - cfg.t0), np.zeros(S, dtype=np.int64))


def _disaggregated(cfg: RLSimConfig, rng) -> RLSim:
    R, D, S = cfg.rollout_devices, cfg.devices, cfg.steps
    if not 0 < R < D:
        raise ValueError(f"rollout_devices: {R} must be in 1..{D - 1}")
    T = D - R
    K = 1 if cfg.mode == "one-step-off" else cfg.staleness
    tail = cfg.mode == "one-step-off"
    sync_s = cfg.weight_bytes / cfg.sync_bytes_per_s
    # (device, phase, start, end, version) before cutting into steps
    raw: list[tuple[int, str, float, float, int]] = []
    syncs: list[tuple[float, float]] = []  # weight sync k: [start, end); publishes version k + 1
    gen_end = np.zeros(S + K + 1)
    train_end = -np.inf
    rollout_free = cfg.t0
    total = total_trained = 0.0
    version_at_gen = np.zeros(S + K + 1, dtype=np.int64)
    for k in range(S + K + 1):  # batches past step S-1 keep the rollouts busy to the end of the run
        # batch k: needs version k - K, published by sync k - K - 1
        need = k - K - 1
        ready = cfg.t0 if need < 0 else syncs[need][1]
        start = max(rollout_free, ready)
        if start > rollout_free:
            raw += [(d, "wait", rollout_free, start, version_at_gen[k - 1] if k else 0) for d in range(R)]
        version = sum(1 for s in syncs if s[1] <= start)
        version_at_gen[k] = version
        gen, tokens = _gen_times(rng, cfg, R, tail)
        total += tokens
        ends = []
        for d in range(R):
            t, left = start, gen[d]
            for s0, s1 in syncs:  # a sync during generation pauses it
                if s1 <= t or left <= 0:
                    continue
                if s0 >= t + left:
                    break
                raw.append((d, "generate", t, s0, version))
                left -= s0 - t
                t = s1
                version += 1
            raw.append((d, "generate", t, t + left, version))
            ends.append(t + left)
        gen_end[k] = max(ends)
        for d, e in enumerate(ends):
            if e < gen_end[k]:
                raw.append((d, "tail", e, gen_end[k], version))  # the batch's tail (one-step-off)
        rollout_free = gen_end[k]
        if k >= S:
            continue
        # trainer step k: batch k and the previous sync
        prev = cfg.t0 if k == 0 else syncs[k - 1][1]
        t_start = max(prev, gen_end[k])
        if t_start > prev:
            raw += [(R + j, "wait", prev, t_start, k) for j in range(T)]
        train_end = t_start + tokens / (T * cfg.train_tokens_per_s)
        total_trained += tokens
        raw += [(R + j, "train_update", t_start, train_end, k) for j in range(T)]
        syncs.append((train_end, train_end + sync_s))
        raw += [(d, "weight_sync", train_end, train_end + sync_s, k) for d in range(D)]
    bounds = np.array([cfg.t0] + [s[1] for s in syncs])
    return _cut(raw, bounds, syncs, R, D, S, total_trained, version_at_gen[:S])


def _cut(raw, bounds, syncs, R, D, S, total, version_at_gen) -> RLSim:
    """Cut spans at the step boundaries (``bounds`` [S + 1]); build the truth from the pieces
    (waiting during a weight sync is sync time, not idle: every device takes part in it)."""
    rows: list[tuple] = []

    def idle_s(lo: float, hi: float) -> float:
        return hi - lo - sum(max(0.0, min(hi, s1) - max(lo, s0)) for s0, s1 in syncs)

    truth = np.zeros((S, D, len(CAUSES)))
    for d, phase, a, b, version in raw:
        if b <= a:
            continue
        role = "rollout" if d < R else "trainer"
        for k in range(np.searchsorted(bounds, a, side="right") - 1, S):
            lo, hi = max(a, bounds[k]), min(b, bounds[k + 1])
            if lo >= b or k < 0:
                break
            if hi <= lo:
                continue
            if phase == "tail":  # idle without a span: finished its share of the batch early
                truth[k, d, CAUSES.index("generation_tail")] += idle_s(lo, hi)
                continue
            if phase == "wait":
                truth[k, d, CAUSES.index("staleness_throttle" if role == "rollout" else "starvation")] += idle_s(lo, hi)
            rows.append((k, d, int(version), phase, role, lo, hi, 0))
    # keep the version non-decreasing in time for every rank (a wait carries the version held)
    rows.sort(key=lambda r: (r[1], r[5]))
    high: dict[int, int] = {}
    for i, (k, d, v, *rest) in enumerate(rows):
        high[d] = max(v, high.get(d, v))
        rows[i] = (k, d, high[d], *rest)
    lag = np.arange(S, dtype=np.int64) - version_at_gen
    return RLSim(Spans.build(*zip(*rows, strict=True)), truth, np.diff(bounds), total / (bounds[-1] - bounds[0]), lag)
