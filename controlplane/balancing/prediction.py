"""Load forecasts for the planner: EMA and sliding window, with one-step-ahead error.

``history [T, L, E]``: tokens per logical expert for the last T steps, oldest first. A
forecast is the ``[L, E]`` load the next step is expected to bring; feed it to
``plan_placement``. ``one_step_ahead_error`` replays a history to compare forecasters.
"""

from __future__ import annotations

import numpy as np

from controlplane.balancing.validate import check_count

__all__ = ["ema_forecast", "one_step_ahead_error", "window_forecast"]


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


def _check_alpha(alpha: float) -> float:
    if not (isinstance(alpha, int | float) and 0 < alpha <= 1):
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    return float(alpha)


def ema_forecast(history: np.ndarray, *, alpha: float = 0.2) -> np.ndarray:
    """Exponential moving average: ``history [T, L, E]`` -> float64 ``[L, E]``.

    ``f_0 = h_0``, ``f_t = alpha * h_t + (1 - alpha) * f_{t-1}``; ``alpha`` in (0, 1]."""
    h = _check_history(history)
    alpha = _check_alpha(alpha)
    f = h[0].copy()
    for t in range(1, h.shape[0]):
        f += alpha * (h[t] - f)
    return f


def window_forecast(history: np.ndarray, *, window: int = 20) -> np.ndarray:
    """Mean of the last ``window`` steps (all of them if fewer): ``[T, L, E]`` -> ``[L, E]``."""
    h = _check_history(history)
    window = check_count("window", window)
    return h[-window:].mean(axis=0)


def one_step_ahead_error(
    history: np.ndarray, *, method: str, alpha: float = 0.2, window: int = 20, warmup: int = 1
) -> float:
    """Mean relative L1 error of forecasting step t from steps < t, over t >= ``warmup``.

    ``method``: "ema" (with ``alpha``) or "window" (with ``window``). Error of one step =
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
    else:
        raise ValueError(f"method must be 'ema' or 'window', got {method!r}")
    actual = h[warmup:]
    total = actual.sum(axis=(1, 2))
    err = np.abs(forecasts - actual).sum(axis=(1, 2))
    keep = total > 0
    if not keep.any():
        return 0.0
    return float((err[keep] / total[keep]).mean())
