"""Load forecasts for the planner: EMA, sliding window and trend-aware (Holt), with
one-step-ahead error.

``history [T, L, E]``: tokens per logical expert for the last T steps, oldest first. A
forecast is the ``[L, E]`` load the next step is expected to bring; feed it to
``plan_placement``. ``one_step_ahead_error`` replays a history to compare forecasters;
``choose_forecaster`` picks, from a fixed list, the one with the least such error on the
history itself, and ``forecast`` evaluates one by name.

``routed_balancedness`` is what a job measures under a placement: the balancedness of each
step with that step's tokens routed among the replicas (``routing.route_replicas``); its mean
over steps, per layer, not the balancedness of the steps' mean, which hides every step's noise.
``expected_balancedness`` predicts it out of sample, for the steps a plan will be measured on
(``measured_steps``): routed draws of those steps from the window's drift and noise
(``drift_and_noise``). Scored on the window it was fitted to, a placement promises too much.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from moeplane.controlplane.balancing.placement import layer_balancedness
from moeplane.controlplane.balancing.routing import cached_table, route_with, tile_table
from moeplane.controlplane.balancing.validate import check_count

__all__ = [
    "AHEAD_STEPS",
    "APPLY_LAG_STEPS",
    "FORECASTERS",
    "MEASURE_STEPS",
    "choose_forecaster",
    "drift_and_noise",
    "ema_forecast",
    "expected_balancedness",
    "forecast",
    "holt_forecast",
    "measured_steps",
    "one_step_ahead_error",
    "routed_balancedness",
    "window_forecast",
]

# candidates of ``choose_forecaster``: (method, parameters), fixed ahead of any trace
FORECASTERS: tuple[tuple[str, dict[str, float]], ...] = (
    ("window", {"window": 20}),
    ("window", {"window": 5}),
    ("ema", {"alpha": 0.2}),
    ("ema", {"alpha": 0.5}),
    ("holt", {"alpha": 0.2, "beta": 0.1}),
)


def _check_history(history: object) -> np.ndarray:
    arr = np.asarray(history)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise ValueError(f"history must be a float or integer array, got dtype {arr.dtype}")
    if arr.ndim != 3 or 0 in arr.shape:
        raise ValueError(f"history must have shape [steps, layers, experts], got {arr.shape}")
    out = arr.astype(np.float64)
    if not np.isfinite(out).all() or (out < 0).any():
        raise ValueError("history must be finite and non-negative")
    return out


def _check_alpha(alpha: float, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not (isinstance(alpha, int | float) and 0 < alpha <= 1):
        raise ValueError(f"{name} must be in (0, 1], got {alpha!r}")
    return float(alpha)


def _holt_states(h: np.ndarray, alpha: float, beta: float):
    """Yield (t, level, slope) after steps 0..t of ``h [T, L, E]`` (Holt's linear method:
    level and slope smoothed with ``alpha`` and ``beta``; slope starts at 0)."""
    level = h[0].copy()
    slope = np.zeros_like(level)
    yield 0, level, slope
    for t in range(1, h.shape[0]):
        prev = level
        level = alpha * h[t] + (1 - alpha) * (prev + slope)
        slope = beta * (level - prev) + (1 - beta) * slope
        yield t, level, slope


def ema_forecast(history: np.ndarray, *, alpha: float = 0.2) -> np.ndarray:
    """Exponential moving average: ``history [T, L, E]`` -> float64 ``[L, E]``.

    ``f_0 = h_0``, ``f_t = alpha * h_t + (1 - alpha) * f_{t-1}``; ``alpha`` in (0, 1]."""
    h = _check_history(history)
    alpha = _check_alpha(alpha)
    f = h[0].copy()
    for t in range(1, h.shape[0]):
        f += alpha * (h[t] - f)
    return f


def holt_forecast(
    history: np.ndarray, *, alpha: float = 0.2, beta: float = 0.1, horizon: int = 1
) -> np.ndarray:
    """Trend-aware forecast (EMA of level and of slope, Holt's linear method):
    ``history [T, L, E]`` -> float64 ``[L, E]``, the load ``horizon`` steps after the last,
    ``max(level + horizon * slope, 0)``. ``alpha``, ``beta`` in (0, 1]."""
    h = _check_history(history)
    alpha = _check_alpha(alpha)
    beta = _check_alpha(beta, "beta")
    horizon = check_count("horizon", horizon)
    _, level, slope = deque(_holt_states(h, alpha, beta), maxlen=1)[0]
    return np.maximum(level + horizon * slope, 0.0)


def window_forecast(history: np.ndarray, *, window: int = 20) -> np.ndarray:
    """Mean of the last ``window`` steps (all of them if fewer): ``[T, L, E]`` -> ``[L, E]``."""
    h = _check_history(history)
    window = check_count("window", window)
    return h[-window:].mean(axis=0)


def forecast(
    history: np.ndarray, *, method: str, alpha: float = 0.2, beta: float = 0.1,
    window: int = 20,
) -> np.ndarray:
    """The next step's load by ``method`` ("ema", "window" or "holt"): ``[T, L, E]`` ->
    ``[L, E]``."""
    if method == "ema":
        return ema_forecast(history, alpha=alpha)
    if method == "window":
        return window_forecast(history, window=window)
    if method == "holt":
        return holt_forecast(history, alpha=alpha, beta=beta)
    raise ValueError(f"method must be 'ema', 'window' or 'holt', got {method!r}")


def choose_forecaster(
    history: np.ndarray,
    *,
    candidates: tuple[tuple[str, dict[str, float]], ...] = FORECASTERS,
    warmup: int = 1,
) -> int:
    """Index into ``candidates`` ((method, parameters) pairs, as ``FORECASTERS``) of the one
    with the least ``one_step_ahead_error`` on ``history [T, L, E]`` (ties: the first)."""
    if not candidates:
        raise ValueError("candidates must not be empty")
    errors = [
        one_step_ahead_error(history, method=m, warmup=warmup, **params)
        for m, params in candidates
    ]
    return int(np.argmin(errors))


def one_step_ahead_error(
    history: np.ndarray,
    *,
    method: str,
    alpha: float = 0.2,
    beta: float = 0.1,
    window: int = 20,
    warmup: int = 1,
) -> float:
    """Mean relative L1 error of forecasting step t from steps < t, over t >= ``warmup``.

    ``method``: "ema" (with ``alpha``), "window" (with ``window``) or "holt" (with
    ``alpha``, ``beta``; one step ahead). Error of one step =
    sum |forecast - actual| / sum actual over all layers and experts (steps with no load are
    skipped). Needs ``warmup`` >= 1 and at least ``warmup + 1`` steps.
    """
    h = _check_history(history)
    warmup = check_count("warmup", warmup)
    if h.shape[0] <= warmup:
        raise ValueError(f"history needs more than warmup = {warmup} steps, got {h.shape[0]}")
    steps = h.shape[0]
    if method == "ema":
        alpha = _check_alpha(alpha)
        forecasts = np.empty_like(h[warmup:])
        f = h[0].copy()
        for t in range(1, steps):
            if t >= warmup:
                forecasts[t - warmup] = f
            f += alpha * (h[t] - f)
    elif method == "window":
        window = check_count("window", window)
        csum = np.concatenate([np.zeros_like(h[:1]), np.cumsum(h, axis=0)])
        t = np.arange(warmup, steps)
        lo = np.maximum(t - window, 0)
        forecasts = (csum[t] - csum[lo]) / (t - lo)[:, None, None]
    elif method == "holt":
        alpha = _check_alpha(alpha)
        beta = _check_alpha(beta, "beta")
        forecasts = np.empty_like(h[warmup:])
        for t, level, slope in _holt_states(h[:-1], alpha, beta):
            if t + 1 >= warmup:
                forecasts[t + 1 - warmup] = np.maximum(level + slope, 0.0)
    else:
        raise ValueError(f"method must be 'ema', 'window' or 'holt', got {method!r}")
    actual = h[warmup:]
    total = actual.sum(axis=(1, 2))
    err = np.abs(forecasts - actual).sum(axis=(1, 2))
    keep = total > 0
    if not keep.any():
        return 0.0
    return float((err[keep] / total[keep]).mean())


def routed_balancedness(window: np.ndarray, phy2log: np.ndarray, *, gpus: int) -> np.ndarray:
    """Per step and layer, max GPU load / mean GPU load with the step's tokens routed among
    the replicas: ``window [T, L, E]`` tokens (rounded to integers), ``phy2log [L, G*S]`` ->
    float64 ``[T, L]``. Its mean is the balancedness a job measures, on average, over such
    steps; its mean over steps, per layer, what a plan predicts for each layer."""
    h = _check_history(window)
    steps, layers, experts = h.shape
    tokens = np.rint(h).astype(np.int64).reshape(steps * layers, experts)
    p2l = np.asarray(phy2log)
    if p2l.ndim != 2 or p2l.shape[0] != layers:
        raise ValueError(
            f"phy2log must have shape [layers, gpus*slots] with {layers} layers, got {p2l.shape}"
        )
    # the steps become layers of one call: the placement's table (built once per placement,
    # ``route_replicas``' cache) tiled over the steps, one vectorised routing
    table = tile_table(cached_table(p2l, gpus, experts), steps)
    slot_tokens = route_with(table, tokens)
    per_gpu = slot_tokens.reshape(steps * layers, gpus, -1).sum(axis=2).astype(np.float64)
    return layer_balancedness(per_gpu).reshape(steps, layers)


# a plan's measured balancedness: the mean over (up to) this many steps after the one the job
# applied it at (``controller.runner``)
MEASURE_STEPS = 10
# a plan decided on the loads of steps <= t reaches the job while it runs step t + 1 (t's loads
# arrive when t has ended) and is applied at the start of step t + 2
APPLY_LAG_STEPS = 2
AHEAD_STEPS: tuple[int, ...] = tuple(range(APPLY_LAG_STEPS + 1, APPLY_LAG_STEPS + 1 + MEASURE_STEPS))


def measured_steps(min_interval_s: float, step_time_s: float) -> tuple[int, ...]:
    """The steps, counted after the last one seen, that a plan decided now is measured on:
    from the one after it is applied to the last before the next plan can take its place
    (``min_interval_s`` later, at ``step_time_s`` seconds a step), at most ``MEASURE_STEPS``."""
    if not (step_time_s > 0 and min_interval_s >= 0):
        raise ValueError(f"step_time_s must be > 0 and min_interval_s >= 0, got {step_time_s}, {min_interval_s}")
    runs = int(min_interval_s // step_time_s) - 1  # steps it runs before the next is applied, less one
    first = APPLY_LAG_STEPS + 1
    return tuple(range(first, first + min(max(runs, 1), MEASURE_STEPS)))


def _weights(steps: int, alpha: float) -> np.ndarray:
    """EMA weights ``[steps]`` of ``ema_forecast``, newest first (they sum to 1)."""
    w = alpha * (1 - alpha) ** np.arange(steps, dtype=np.float64)
    w[-1] = (1 - alpha) ** (steps - 1)
    return w


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0, ``a [N, K]`` with a few columns: the best of the
    unconstrained fits on every subset of the columns whose solution is non-negative."""
    best, best_res = np.zeros(a.shape[1]), float(b @ b)
    for mask in range(1, 2 ** a.shape[1]):
        cols = [k for k in range(a.shape[1]) if mask >> k & 1]
        x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (x < 0).any():
            continue
        res = float(np.sum((a[:, cols] @ x - b) ** 2))
        if res < best_res:
            best, best_res = np.zeros(a.shape[1]), res
            best[cols] = x
    return best


def drift_and_noise(window: np.ndarray) -> tuple[float, np.ndarray]:
    """How log-loads move: ``window [T, L, E]`` -> ``(drift, noise [L, E])``.

    Model: ``log(1 + x[t, l, e]) = level[t, l, e] + n[t, l, e]``; the level is a random walk
    with per-step variance ``drift``; ``n`` is the step's own noise, of variance
    ``noise[l, e] = c0 + c1 / (1 + mean_t x[t, l, e])`` (batch-to-batch variation, and
    counting noise, which scales as one over the count). ``drift``, ``c0``, ``c1`` >= 0 are
    fitted by least squares over every lag k of the window to
    ``(y[t + k] - y[t])^2 = k * drift + 2 * noise``, each expert's rows weighted by its share
    of its layer's tokens (``mean_t x[t, l, e]`` over the layer's mean expert; the squared
    residuals by its square): a log-error moves a GPU's load in proportion to the expert's
    tokens, so the fit describes the experts that carry the load. In a real run the small
    experts' log-loads move several times as much as the big ones' (in the 4 x 16-expert torch
    run of docs/bench-predictions.md, 7-24x at lag 1, split at the median); unweighted, their drift
    was imposed on the big experts and the prediction overshot by 27-37 %. With two steps (one
    lag) drift and noise cannot be told apart and all of it counts as drift (the same weights);
    with one step both are 0."""
    h = _check_history(window)
    steps = h.shape[0]
    mean = h.mean(axis=0)  # [L, E] tokens
    inv = 1.0 / (1.0 + mean)
    if steps < 2:
        return 0.0, np.zeros_like(inv)
    # [L*E] an expert's share of its layer's tokens, relative to the layer's mean expert
    share = np.divide(mean, mean.mean(axis=1, keepdims=True), out=np.zeros_like(mean),
                      where=mean.mean(axis=1, keepdims=True) > 0).ravel()
    if not share.any():
        return 0.0, np.zeros_like(inv)
    y = np.log1p(h)
    if steps == 2:
        sq = ((y[1] - y[0]) ** 2).ravel()
        return float(sq @ share**2 / (share @ share)), np.zeros_like(inv)
    rows, targets = [], []
    for k in range(1, steps):
        sq = ((y[k:] - y[:-k]) ** 2).mean(axis=0)  # [L, E], over the window's pairs
        # weight ~ pairs / variance of a lag-k square (long lags share most of their path),
        # times the expert's share of the tokens
        scale = np.sqrt(steps - k) / k * share
        rows.append(scale[:, None] * np.stack([np.full(inv.size, float(k)), np.full(inv.size, 2.0),
                                               2.0 * inv.ravel()], axis=1))
        targets.append(scale * sq.ravel())
    drift, c0, c1 = _nonnegative_lstsq(np.concatenate(rows), np.concatenate(targets))
    return float(drift), c0 + c1 * inv


def _same_totals(h: np.ndarray) -> np.ndarray:
    """``h [T, L, E]`` with each step's tokens of a layer rescaled to that layer's mean total
    over the steps: only the shares of the experts matter to balancedness, and a step read
    while some nodes had not reported yet holds part of its tokens."""
    totals = h.sum(axis=2, keepdims=True)  # [T, L, 1]
    scale = np.divide(totals.mean(axis=0, keepdims=True), totals, out=np.ones_like(totals),
                      where=totals > 0)
    return h * scale


def expected_balancedness(
    window: np.ndarray,
    placements: list[np.ndarray],
    *,
    gpus: int,
    ahead: tuple[int, ...] = AHEAD_STEPS,
    alpha: float = 0.3,
    samples: int = 5,
    seed: int = 0,
) -> list[np.ndarray]:
    """What a job will measure under each placement on the steps after the window: an
    out-of-sample estimate. ``window [T, L, E]`` recent tokens, oldest first; ``placements``:
    ``phy2log [L, G*S]`` arrays -> one float64 ``[L]`` per placement, the mean routed
    balancedness (``routed_balancedness``) per layer over ``samples`` draws of each step
    ``ahead`` of the window's last (the default: the steps a plan is measured on).

    The draws follow ``drift_and_noise``: a step d ahead is ``exp(mu + s_d * z) - 1``, ``mu``
    the EMA (``alpha``) of the window's log-loads, ``z`` standard normal (seeded) and ``s_d^2``
    the variance of that step's log-load about ``mu``: the drift over d steps and over the
    EMA's own lag, the step's noise and the noise left in the EMA. Each step's tokens of a
    layer are first rescaled to the window's mean total (a step read before every node
    reported holds part of its tokens). Every placement is scored on the same draws. Scoring a placement on the steps it was fitted to instead promises
    too much when loads drift: the job measures it on later steps."""
    h = _check_history(window)
    alpha = _check_alpha(alpha)
    samples = check_count("samples", samples)
    if not ahead or min(ahead) < 1:
        raise ValueError(f"ahead must be steps >= 1, got {ahead!r}")
    h = _same_totals(h)
    drift, noise = drift_and_noise(h)
    y = np.log1p(h)[::-1]  # newest first
    w = _weights(len(y), alpha)
    mu = np.tensordot(w, y, axes=1)  # [L, E]
    idx = np.arange(len(w))
    lag_var = float(w @ np.minimum.outer(idx, idx) @ w)  # the EMA's lag behind the level
    d = np.repeat(np.asarray(ahead, dtype=np.float64), samples)  # [D * samples]
    var = drift * (d + lag_var)[:, None, None] + (1.0 + w @ w) * noise[None]
    z = np.random.default_rng(seed).standard_normal((len(d), *mu.shape))
    draws = np.expm1(mu[None] + np.sqrt(var) * z).clip(min=0.0)
    return [routed_balancedness(draws, p, gpus=gpus).mean(axis=0) for p in placements]
