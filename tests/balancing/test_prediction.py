import numpy as np
import pytest

from controlplane.balancing import ema_forecast, one_step_ahead_error, window_forecast


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
