"""Overhead calibration: a known k and static load recovered from a lagged, noisy meter."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.calibration import NotIdentifiable, OverheadCalibration, deming_slope, fit_overhead
from flexmodel.errors import FlexModelError

K, STATIC_KW = 1.32, 150.0
FIT = {"period_s": 1.0, "window_s": 60.0, "settle_s": 240.0}


def site(
    seed: int,
    *,
    samples: int = 5000,
    k: float = K,
    static_kw: float = STATIC_KW,
    delay_s: int = 8,
    cooling_s: float = 30.0,
    step_kw: float = 200.0,
    gpu_noise_kw: float = 3.0,
    meter_noise_kw: float = 5.0,
) -> tuple[np.ndarray, np.ndarray]:
    """GPU power held 300-600 s at levels up to `step_kw` either side of 600 kW (caps, jobs
    starting and ending), sampled every second; the meter sees static + k * GPU through a
    first-order cooling lag and a delay; both series carry noise."""
    rng = np.random.default_rng(seed)
    levels: list[float] = []
    while len(levels) < samples:
        levels += [600.0 + rng.uniform(-step_kw, step_kw)] * int(rng.integers(300, 600))
    gpu_true = np.array(levels[:samples])
    keep = np.exp(-1.0 / cooling_s)
    cooled = np.empty(samples)
    cooled[0] = gpu_true[0]
    for i in range(1, samples):
        cooled[i] = keep * cooled[i - 1] + (1 - keep) * gpu_true[i]
    seen = np.concatenate([np.full(delay_s, cooled[0]), cooled[: samples - delay_s]])
    facility = static_kw + k * seen + rng.normal(0, meter_noise_kw, samples)
    return gpu_true + rng.normal(0, gpu_noise_kw, samples), facility


def fitted(gpu, facility, **options) -> OverheadCalibration:
    result = fit_overhead(gpu, facility, **{**FIT, **options})
    assert isinstance(result, OverheadCalibration), result
    return result


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fit_recovers_k_and_the_static_load_where_a_level_regression_is_biased_low(seed):
    gpu, facility = site(seed)
    fit = fitted(gpu, facility)
    assert abs(fit.k - K) < 4 * fit.k_stderr
    assert abs(fit.static_kw - STATIC_KW) < 4 * fit.static_stderr_kw
    assert (fit.k_stderr < 0.01, fit.static_stderr_kw < 5) == (True, True)  # useful errors
    assert fit.points >= 5
    # the meter's path: a delay of 8 samples (the step shows half a period after it on
    # average: 7.5 s) and a 30 s first-order lag
    assert fit.path.source == "identified"
    assert fit.path.dead_s == pytest.approx(7.5, abs=max(3 * fit.path.dead_stderr_s, 1.0))
    assert fit.path.tau_s == pytest.approx(30.0, abs=max(3 * fit.path.tau_stderr_s, 1.5))
    naive_k = np.polyfit(gpu, facility, 1)[0]  # facility levels on GPU levels
    assert naive_k < K - 0.05
    assert naive_k < fit.k - 20 * fit.k_stderr


@pytest.mark.parametrize("tau_s", [3.0, 10.0, 30.0])
@pytest.mark.parametrize("dead_s", [0, 20])
def test_the_meter_path_is_dead_time_and_a_time_constant_not_a_half_rise(tau_s, dead_s):
    """First-order meters of 3, 10 and 30 s, with and without 20 s of transport delay: the fit
    gives the time constant itself (a half-rise time reads 2, 7 and 21 s) and the dead time
    apart, each within three of its standard errors (and a period)."""
    gpu, facility = site(7, delay_s=dead_s, cooling_s=tau_s)
    path = fitted(gpu, facility).path
    assert path.source == "identified"
    assert path.tau_s == pytest.approx(tau_s, abs=3 * path.tau_stderr_s + 0.1 * tau_s)
    assert path.dead_s == pytest.approx(max(dead_s - 0.5, 0), abs=3 * path.dead_stderr_s + 1.0)
    assert path.tau_stderr_s < 0.2 * tau_s


def test_noise_free_gpu_readings_make_the_fit_ordinary_least_squares():
    gpu, facility = site(4, gpu_noise_kw=0.0)
    fit = fitted(gpu, facility)
    assert abs(fit.k - K) < 4 * fit.k_stderr


def test_gpu_readings_that_repeat_between_updates_do_not_make_every_wobble_a_step():
    """Most sample-to-sample changes are zero (readings rounded to 1 kW): the noise looks like
    none, and only the floor (2% of the GPUs' median power) keeps the wobbles out."""
    gpu, facility = site(6, gpu_noise_kw=0.3)
    fit = fitted(np.round(gpu), facility)
    assert abs(fit.k - K) < 4 * fit.k_stderr
    assert fit.points >= 5


@pytest.mark.parametrize(
    ("changes", "options", "expected"),
    [
        ({"step_kw": 4.0}, {}, r"0 isolated GPU step\(s\) found, 3 needed"),
        ({"samples": 1300}, {}, r"[12] isolated GPU step\(s\) found, 3 needed"),
        ({}, {"min_step_kw": 500.0}, r"0 isolated GPU step\(s\) found, 3 needed: .* exceed 500 kW"),
        ({"meter_noise_kw": 400.0}, {}, "is not identified to 5%: the GPU steps"),
        ({"cooling_s": 120.0}, {}, r"still moves \d\.\d% of a step .* \(raise settle_s\)"),
        ({"k": 0.6}, {}, "below 1: the meter does not see all of these GPUs"),
        ({"k": -1.0}, {}, "the meter does not move with the GPU steps"),
    ],
)
def test_data_that_cannot_identify_k_is_refused_with_the_reason(changes, options, expected):
    gpu, facility = site(5, **changes)
    result = fit_overhead(gpu, facility, **{**FIT, **options})
    assert isinstance(result, NotIdentifiable)
    assert re.search(expected, result.reason), result.reason


@pytest.mark.parametrize(
    ("gpu", "facility", "options", "expected"),
    [
        ([1.0, 2.0], [1.0], {}, "of one length"),
        ([[1.0]], [[1.0]], {}, "1-D"),
        ([1.0, float("nan")], [1.0, 2.0], {}, "must be finite"),
        ([1.0] * 9, [1.0] * 9, {"period_s": 0.0}, r"period_s \(0.0\) must be positive"),
        ([1.0] * 9, [1.0] * 9, {"window_s": 1.0}, "at least two periods"),
        ([1.0] * 9, [1.0] * 9, {"settle_s": -1.0}, "not negative"),
        ([1.0] * 9, [1.0] * 9, {"min_points": 1}, "min_points >= 2"),
    ],
)
def test_inconsistent_input_is_an_error_naming_it(gpu, facility, options, expected):
    with pytest.raises(FlexModelError, match=expected):
        fit_overhead(gpu, facility, **{**FIT, **options})


def test_deming_through_the_origin_between_its_two_limits():
    rng = np.random.default_rng(0)
    x = rng.uniform(-100, 100, 40)
    y = 1.3 * x + rng.normal(0, 5, 40)
    ols_y_on_x, ols_x_on_y = float(x @ y / (x @ x)), float(y @ y / (x @ y))
    assert deming_slope(x, y, float("inf")) == pytest.approx(ols_y_on_x)
    assert deming_slope(x, y, 1e12) == pytest.approx(ols_y_on_x)
    assert deming_slope(x, y, 1e-12) == pytest.approx(ols_x_on_y)
    assert ols_y_on_x < deming_slope(x, y, 1.0) < ols_x_on_y
    exact = 1.3 * x
    for ratio in (1e-6, 1.0, 1e6):
        assert deming_slope(x, exact, ratio) == pytest.approx(1.3)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shift_kw=st.floats(-100.0, 5000.0),
    scale=st.sampled_from([1e-3, 0.5, 3.0, 1e3]),
)
def test_the_fit_moves_with_the_static_load_and_not_with_the_units(seed, shift_kw, scale):
    gpu, facility = site(seed, samples=3000)
    base = fit_overhead(gpu, facility, **FIT)
    shifted = fit_overhead(gpu, facility + shift_kw, **FIT)
    scaled = fit_overhead(gpu * scale, facility * scale, **FIT)
    if isinstance(base, NotIdentifiable):  # a draw with too few steps: refused the same way
        assert isinstance(shifted, NotIdentifiable)
        assert isinstance(scaled, NotIdentifiable)
        return
    assert isinstance(shifted, OverheadCalibration)
    assert isinstance(scaled, OverheadCalibration)
    for other in (shifted, scaled):
        assert (other.k, other.k_stderr) == pytest.approx((base.k, base.k_stderr), rel=1e-6)
        assert other.points == base.points
        assert other.path.dead_s == pytest.approx(base.path.dead_s, abs=1e-6)
        assert other.path.tau_s == pytest.approx(base.path.tau_s, rel=1e-6)
    assert shifted.static_kw == pytest.approx(base.static_kw + shift_kw, rel=1e-9, abs=1e-6)
    assert shifted.static_stderr_kw == pytest.approx(base.static_stderr_kw, rel=1e-6)
    assert scaled.static_kw == pytest.approx(base.static_kw * scale, rel=1e-6)
    assert scaled.static_stderr_kw == pytest.approx(base.static_stderr_kw * scale, rel=1e-6)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.floats(1.05, 1.8), static_kw=st.floats(0.0, 2000.0))
def test_a_known_overhead_is_recovered_within_its_error(seed, k, static_kw):
    """Noise-free meter and GPUs: only the model's own approximations remain."""
    gpu, facility = site(seed, k=k, static_kw=static_kw, gpu_noise_kw=0.0, meter_noise_kw=0.0)
    fit = fit_overhead(gpu, facility, **FIT)
    if isinstance(fit, NotIdentifiable):
        assert "isolated GPU step" in fit.reason  # a draw with too few steps
        return
    assert fit.k == pytest.approx(k, rel=1e-3)
    assert fit.static_kw == pytest.approx(static_kw, abs=1.0)
