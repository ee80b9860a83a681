import numpy as np
import pytest

from harness.traces import drifting_trace, workload_trace
from moeplane.controlplane.balancing import (
    FORECASTERS,
    choose_forecaster,
    ema_forecast,
    expected_balancedness,
    forecast,
    holt_forecast,
    identity_placement,
    one_step_ahead_error,
    plan_placement,
    routed_balancedness,
    window_forecast,
)
from moeplane.controlplane.balancing.prediction import (
    AHEAD_STEPS,
    APPLY_LAG_STEPS,
    MEASURE_STEPS,
    drift_and_noise,
    measured_steps,
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


def test_drift_and_noise_recover_a_random_walk_and_its_noise():
    # log-loads: a random walk of 0.1 per step plus 0.05 of batch noise, counts large enough
    # that counting noise does not matter
    rng = np.random.default_rng(0)
    level = np.cumsum(rng.normal(0, 0.1, size=(10, 4, 64)), axis=0) + np.log(1e6)
    loads = np.expm1(level + rng.normal(0, 0.05, size=level.shape))
    drift, noise = drift_and_noise(loads)
    assert drift == pytest.approx(0.01, rel=0.25)
    assert noise.shape == (4, 64)
    assert 0.5 * 0.0025 < noise.mean() < 2 * 0.0025
    # no movement at all: nothing to fit; one step: nothing to measure
    assert drift_and_noise(np.full((5, 2, 3), 7.0))[0] == 0.0
    assert drift_and_noise(loads[:1])[1].max() == 0.0


def _plan_scores(trace, t, window, gpus, slots):
    """In-sample, out-of-sample (``expected_balancedness``) and measured balancedness of the
    placement planned at step t on the EMA of the window: measured, as a job does, over the
    steps a plan is judged on (``AHEAD_STEPS`` after t)."""
    win = trace[max(0, t - window + 1) : t + 1]
    p2l = plan_placement(ema_forecast(win, alpha=0.3), gpus=gpus, slots_per_gpu=slots).phy2log
    later = trace[t + AHEAD_STEPS[0] : t + AHEAD_STEPS[-1] + 1]
    measured = routed_balancedness(later, p2l, gpus=gpus).mean()
    in_sample = routed_balancedness(win, p2l, gpus=gpus).mean()
    (ahead,) = expected_balancedness(win, [p2l], gpus=gpus)
    return in_sample, float(ahead.mean()), measured


@pytest.mark.parametrize("family", ["random walk", "sim workload, short window"])
def test_out_of_sample_prediction_is_closer_to_what_the_next_steps_measure(family):
    if family == "random walk":
        trace = drifting_trace(80, 8, 64, tokens_per_layer=2e5, drift=0.05, batch_noise=0.02, seed=3)
        window, cuts, gpus = 10, range(20, 66, 8), 16
    else:  # fast drift early in training and a window of 3 steps, as a job's first plan
        trace = workload_trace(60, 8, 32, gpus=8, top_k=4)
        window, cuts, gpus = 3, range(2, 46, 8), 8
    scores = np.array([_plan_scores(trace, t, window, gpus, 5) for t in cuts])
    in_sample, ahead, measured = scores.T
    err_in = np.abs(measured - in_sample) / measured
    err_ahead = np.abs(measured - ahead) / measured
    assert (in_sample < measured).all()  # the steps a placement was fitted to flatter it
    assert err_ahead.mean() < 0.6 * err_in.mean(), (err_ahead, err_in)


def test_a_plan_is_measured_until_the_next_can_take_its_place():
    first = APPLY_LAG_STEPS + 1
    assert measured_steps(10.0, 1.25) == tuple(range(first, first + 7))  # 8 steps, less one
    assert measured_steps(600.0, 1.0) == AHEAD_STEPS  # at most MEASURE_STEPS
    assert len(AHEAD_STEPS) == MEASURE_STEPS
    assert measured_steps(0.0, 1.0) == (first,)
    with pytest.raises(ValueError, match="step_time_s"):
        measured_steps(10.0, 0.0)


def test_without_drift_the_prediction_is_the_steps_own_balancedness():
    step = np.random.default_rng(4).gamma(2.0, 500.0, size=(1, 3, 16))
    p2l = identity_placement(3, 16, 4 * 5)
    (one,) = expected_balancedness(step, [p2l], gpus=4)
    np.testing.assert_allclose(one, routed_balancedness(step, p2l, gpus=4)[0])


@pytest.mark.parametrize(("kwargs", "name"), [({"ahead": ()}, "ahead"), ({"ahead": (0, 1)}, "ahead"),
                                              ({"samples": 0}, "samples"), ({"alpha": 2}, "alpha")])
def test_expected_balancedness_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        expected_balancedness(np.ones((3, 1, 4)), [identity_placement(1, 4, 4)], gpus=2, **kwargs)


def test_a_step_read_before_every_node_reported_does_not_move_the_prediction():
    trace = workload_trace(20, 4, 32, gpus=8, top_k=4)
    p2l = plan_placement(ema_forecast(trace, alpha=0.3), gpus=8, slots_per_gpu=5).phy2log
    partial = trace.copy()
    partial[-1] = np.rint(partial[-1] / 4)  # one node of four so far: the same shares, fewer tokens
    (whole,) = expected_balancedness(trace, [p2l], gpus=8)
    (part,) = expected_balancedness(partial, [p2l], gpus=8)
    assert abs(part.mean() - whole.mean()) < 0.01 * whole.mean()


def _mixed_drift_trace(steps=40, layers=4, seed=5):
    """[steps, layers, 16] tokens: 4 big experts (~1,000 tokens) whose log-loads walk by 0.03 a
    step, and 12 small ones (~30 tokens) whose log-loads swing by 0.6 about their level (AR(1),
    0.8 a step): as in a real torch run, where the small experts move several times as much,
    in log terms, as the big ones."""
    rng = np.random.default_rng(seed)
    big = np.log(1000.0) + np.cumsum(rng.normal(0.0, 0.03, size=(steps, layers, 4)), axis=0)
    swing = np.zeros((steps, layers, 12))
    for t in range(1, steps):
        swing[t] = 0.8 * swing[t - 1] + rng.normal(0.0, 0.6 * np.sqrt(1 - 0.8**2), size=(layers, 12))
    level = np.concatenate([big, np.log(30.0) + swing], axis=2)
    return rng.poisson(np.exp(level)).astype(np.float64)


def test_the_drift_is_that_of_the_experts_that_carry_the_tokens():
    trace = _mixed_drift_trace()
    drift, _ = drift_and_noise(trace[:20])
    # about the big experts' 0.03 ** 2 = 0.0009 a step, not what the small ones' swings add to
    # an unweighted fit
    assert drift < 0.005, drift
    # and what a placement then measures is predicted within 5 % (an unweighted fit draws the
    # big experts with the small ones' drift and predicts far too high)
    win, gpus = trace[:20], 4
    p2l = plan_placement(ema_forecast(win, alpha=0.3), gpus=gpus, slots_per_gpu=5).phy2log
    later = trace[19 + AHEAD_STEPS[0] : 19 + AHEAD_STEPS[-1] + 1]
    measured = routed_balancedness(later, p2l, gpus=gpus).mean()
    (ahead,) = expected_balancedness(win, [p2l], gpus=gpus)
    assert abs(ahead.mean() - measured) < 0.05 * measured, (ahead.mean(), measured)
