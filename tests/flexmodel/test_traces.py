"""Recorded traces: uneven sampling onto a uniform grid, gaps kept missing (flexmodel/traces.py)."""

import numpy as np
import pytest

from flexmodel.errors import FlexModelError
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
