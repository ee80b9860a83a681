"""Load forecasts for the planner: EMA, sliding window and trend-aware (Holt), with
one-step-ahead error.

``history [T, L, E]``: tokens per logical expert for the last T steps, oldest first. A
forecast is the ``[L, E]`` load the next step is expected to bring; feed it to
``plan_placement``. ``one_step_ahead_error`` replays a history to compare forecasters;
``choose_forecaster`` picks, from a fixed list, the one with the least such error on the
history itself, and ``forecast`` evaluates one by name.

``routed_balancedness`` predicts what a job measures under a placement: the balancedness of
each of the window's steps with that step's tokens routed among the replicas
(``routing.route_replicas``), averaged over the steps, per layer. It is not the balancedness
of the window's mean, which hides every step's noise and so promises too much.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from moeplane.controlplane.balancing.placement import layer_balancedness
from moeplane.controlplane.balancing.routing import route_with, routing_table
from moeplane.controlplane.balancing.validate import check_count

__all__ = [
    "FORECASTERS",
    "choose_forecaster",
    "ema_forecast",
    "forecast",
    "holt_forecast",
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
    # the steps become layers of one call: one table, one vectorised routing
    table = routing_table(np.tile(p2l, (steps, 1)), gpus=gpus, num_experts=experts)
    slot_tokens = route_with(table, tokens)
    per_gpu = slot_tokens.reshape(steps * layers, gpus, -1).sum(axis=2).astype(np.float64)
    return layer_balancedness(per_gpu).reshape(steps, layers)
