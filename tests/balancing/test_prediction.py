import numpy as np
import pytest

from moeplane.controlplane.balancing import (
    FORECASTERS,
    choose_forecaster,
    ema_forecast,
    forecast,
    holt_forecast,
    one_step_ahead_error,
    window_forecast,
)


def test_ema_and_window_by_hand():
    h = np.array([[[0.0, 10.0]], [[10.0, 10.0]], [[20.0, 10.0]]])
    np.testing.assert_allclose(ema_forecast(h, alpha=0.5), [[12.5, 10.0]])
    np.testing.assert_allclose(window_forecast(h, window=2), [[15.0, 10.0]])
    np.testing.assert_allclose(window_forecast(h, window=10), [[10.0, 10.0]])


def test_one_step_error_prefers_the_forecaster_that_fits_the_trace():
    rng = np.random.default_rng(0)
    steps = 200
    # a trend: the last step predicts best, so a fast EMA beats a long window
    trend = np.linspace(1, 50, steps)[:, None, None] * np.ones((1, 2, 8))
    fast = one_step_ahead_error(trend, method="ema", alpha=0.9, warmup=30)
    slow = one_step_ahead_error(trend, method="window", window=30, warmup=30)
    assert fast < slow
    # stationary noise: a long window averages it out and beats a fast EMA
    noise = rng.gamma(4.0, 25.0, size=(steps, 2, 8))
    assert one_step_ahead_error(noise, method="window", window=30, warmup=30) < (
        one_step_ahead_error(noise, method="ema", alpha=0.9, warmup=30)
    )


def test_window_error_matches_a_direct_loop():
    h = np.random.default_rng(1).gamma(2.0, 3.0, size=(12, 2, 5))
    errs = []
    for t in range(3, 12):
        f = h[max(t - 4, 0) : t].mean(axis=0)
        errs.append(np.abs(f - h[t]).sum() / h[t].sum())
    got = one_step_ahead_error(h, method="window", window=4, warmup=3)
    assert got == pytest.approx(np.mean(errs))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"method": "arima"}, "method"), ({"method": "ema", "alpha": 0}, "alpha"),
     ({"method": "window", "window": 0}, "window"), ({"method": "ema", "warmup": 40}, "warmup")],
)
def test_prediction_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        one_step_ahead_error(np.ones((5, 1, 2)), **kwargs)
    with pytest.raises(ValueError, match="history"):
        ema_forecast(np.ones((5, 2)))


def test_holt_by_hand_and_it_follows_a_trend():
    h = np.array([[[10.0]], [[20.0]], [[30.0]]])
    # level/slope: (10, 0) -> (15, 2.5) -> (0.5*30 + 0.5*17.5, 0.5*(23.75-15) + 0.5*2.5)
    level, slope = 23.75, 0.5 * 8.75 + 1.25
    np.testing.assert_allclose(holt_forecast(h, alpha=0.5, beta=0.5), [[level + slope]])
    np.testing.assert_allclose(holt_forecast(h, alpha=0.5, beta=0.5, horizon=3),
                               [[level + 3 * slope]])
    falling = np.array([[[30.0]], [[10.0]], [[0.0]]])
    assert holt_forecast(falling, alpha=1.0, beta=1.0, horizon=5)[0, 0] == 0.0  # never < 0
    trend = np.linspace(1, 50, 200)[:, None, None] * np.ones((1, 2, 8))
    assert one_step_ahead_error(trend, method="holt", warmup=30) < one_step_ahead_error(
        trend, method="ema", warmup=30
    )


def test_holt_error_matches_a_direct_loop():
    h = np.random.default_rng(2).gamma(2.0, 3.0, size=(12, 2, 5))
    errs = []
    for t in range(3, 12):
        f = holt_forecast(h[:t], alpha=0.3, beta=0.2)
        errs.append(np.abs(f - h[t]).sum() / h[t].sum())
    got = one_step_ahead_error(h, method="holt", alpha=0.3, beta=0.2, warmup=3)
    assert got == pytest.approx(np.mean(errs))


def test_choose_forecaster_takes_the_least_one_step_error():
    rng = np.random.default_rng(0)
    noise = rng.gamma(4.0, 25.0, size=(80, 2, 8))
    walk = 100 * np.exp(np.cumsum(rng.normal(0, 0.1, size=(80, 2, 8)), axis=0))
    for history in (noise, walk):
        errors = [one_step_ahead_error(history, method=m, warmup=20, **p)
                  for m, p in FORECASTERS]
        k = choose_forecaster(history, warmup=20)
        assert errors[k] == min(errors)
        method, params = FORECASTERS[k]
        np.testing.assert_array_equal(forecast(history, method=method, **params),
                                      {"window": window_forecast, "ema": ema_forecast,
                                       "holt": holt_forecast}[method](history, **params))
    # a stationary trace wants a long window, a random walk a short memory
    assert FORECASTERS[choose_forecaster(noise, warmup=20)] == ("window", {"window": 20})
    assert FORECASTERS[choose_forecaster(walk, warmup=20)] != ("window", {"window": 20})


@pytest.mark.parametrize(
    ("call", "name"),
    [(lambda h: holt_forecast(h, beta=0), "beta"), (lambda h: holt_forecast(h, horizon=0),
                                                    "horizon"),
     (lambda h: forecast(h, method="arima"), "method"),
     (lambda h: choose_forecaster(h, candidates=()), "candidates"),
     (lambda h: one_step_ahead_error(h, method="holt", alpha=2.0), "alpha")],
)
def test_forecast_validation(call, name):
    with pytest.raises(ValueError, match=name):
        call(np.ones((5, 1, 2)))
