"""Recorded traces: uneven sampling onto a uniform grid, gaps kept missing (flexmodel/traces.py)."""

import numpy as np
import pytest

from flexmodel.errors import FlexModelError
from flexmodel.sensors import DEFAULT_SENSOR, SensorModel, sensor_for
from flexmodel.traces import analyse_trace, resample_uniform
from tests.flexmodel.synthetic_traces import Loop, power_at, uneven_times, uniform_times


def test_uneven_samples_land_on_a_uniform_grid_and_gaps_stay_missing():
    t = np.array(
        [0.0, 0.1, 0.21, 0.3, 0.39, 0.5, 1.5, 1.6, 1.7] + [1.8 + 0.1 * i for i in range(30)]
    )
    p = 100.0 + 10.0 * t
    grid, x, dt = resample_uniform(t, p)
    assert dt == pytest.approx(0.1)
    assert np.allclose(np.diff(grid), dt)
    inside = (grid > 0.5 + 1e-9) & (grid < 1.5 - 1e-9)
    assert np.all(np.isnan(x[inside]))  # the one-second gap is not invented
    assert np.allclose(x[~np.isnan(x)], 100.0 + 10.0 * grid[~np.isnan(x)])  # linear between


@pytest.mark.parametrize(
    ("times", "power", "message"),
    [
        (np.arange(10.0), np.ones(10), "at least 32 samples, got 10"),
        (np.arange(40.0), np.ones(39), "same length"),
        (np.r_[np.arange(20.0), 19.0, np.arange(21.0, 40.0)], np.ones(40), "sample 20: time 19"),
        (np.arange(40.0), np.r_[np.ones(39), np.nan], "sample 39: time and power must be finite"),
    ],
)
def test_bad_traces_are_refused_naming_the_sample(times, power, message):
    with pytest.raises(FlexModelError, match=message):
        resample_uniform(times, power)


def test_an_uneven_trace_gives_its_waveform_and_phase():
    t = uneven_times(200.0, 100.0, drop=0.2)
    found = analyse_trace(t, power_at(Loop(), t))
    assert found.waveform is not None
    assert found.waveform.period_s == pytest.approx(6.7, rel=0.003)
    assert found.waveform.duty == pytest.approx(6.2 / 6.7, abs=0.01)
    assert found.missing_share > 0.005  # the two-second gap
    assert found.phase_rad is not None
    # Phase 0 is mid-compute: the trace's end sits 200 s into the loop's 6.7 s cycle.
    into = (t[-1] % 6.7) / 6.7
    truth = 2 * np.pi * (into - 0.5 * 6.2 / 6.7)
    assert abs(np.angle(np.exp(1j * (found.phase_rad - truth)))) < 0.3


def test_a_trace_without_a_period_says_why():
    t = uniform_times(120.0, 50.0)
    found = analyse_trace(t, np.random.default_rng(2).normal(400.0, 3.0, t.size))
    assert found.waveform is None
    assert found.phase_rad is None
    assert found.no_period is not None


def test_a_trace_too_short_for_the_periods_sought_is_refused():
    t = uniform_times(10.0, 10.0)
    with pytest.raises(FlexModelError, match="too short to find periods of 5 s"):
        analyse_trace(t, power_at(Loop(period_s=1.0), t), min_period_s=5.0)


def _sensed(period_s, dt_s=0.01, span_s=40.0, seed=0):
    """A compute/communication loop and what an H200's instant field reads of it: each reading
    the mean over 100 ms, held for 100 ms (a 120 ms rise), with noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, span_s, dt_s)
    true = np.where((t % period_s) / period_s < 0.7, 600.0, 250.0)
    k = round(0.1 / dt_s)
    held = np.convolve(true, np.ones(k) / k)[: t.size][(np.arange(t.size) // k) * k]
    noise = 2.0 * rng.standard_normal((2, t.size))
    return t, true + noise[0], held + noise[1]


@pytest.mark.parametrize("period_s", [0.6, 1.0, 2.0, 4.0])
def test_the_sensors_lag_is_taken_out_of_the_phase(period_s):
    """Issue 34, case 6: the H200 read phases late by 0.2-0.8 rad; corrected within 0.3."""
    t, true, sensed = _sensed(period_s)
    truth = analyse_trace(t, true).phase_rad
    late = analyse_trace(t, sensed).phase_rad
    corrected = analyse_trace(t, sensed, sensor_lag_s=0.1).phase_rad

    def gap(a, b):
        return (a - b + np.pi) % (2 * np.pi) - np.pi

    assert abs(gap(corrected, truth)) < 0.3
    assert abs(gap(corrected, truth)) < abs(gap(late, truth))


def test_a_sensor_model_by_gpu_and_by_lag():
    assert sensor_for("NVIDIA H200").lag_s == pytest.approx(0.1)
    assert sensor_for("Tesla V100-SXM2-16GB") == DEFAULT_SENSOR
    assert SensorModel.of_lag(0.1).phase_lag_rad(2.0) == pytest.approx(2 * np.pi * 0.1 / 2.0)
    assert SensorModel.of_lag(0.1).phase_lag_rad(2.0, harmonic=2) == pytest.approx(
        2 * np.pi * 0.2 / 2.0
    )
    with pytest.raises(ValueError, match="lag"):
        SensorModel.of_lag(-1.0)
