import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError
from flexmodel.phases import (
    RayleighAlarm,
    estimate_phase,
    estimate_waveform,
    order_parameters,
    phase_locking_value,
    rayleigh_threshold,
)


def trace(period, duty, dt, seconds, *, cap=1.0, noise=0.0, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, seconds, dt)
    cycle = np.mod(t / period + offset, 1.0)
    power = np.where(cycle < duty, 650.0 * cap, 300.0) + rng.normal(0.0, noise, t.size)
    return t, power, cycle


@settings(max_examples=60, deadline=None)
@given(
    period=st.floats(0.8, 9.0),
    duty=st.floats(0.3, 0.85),
    cap=st.floats(0.6, 1.0),
    seed=st.integers(0, 1000),
)
def test_period_and_duty_from_a_noisy_clipped_trace(period, duty, cap, seed):
    _, power, _ = trace(period, duty, 0.05, max(12 * period, 60.0), cap=cap, noise=15.0, seed=seed)
    found = estimate_waveform(power, 0.05, max_period_s=12.0)
    assert found.period_s == pytest.approx(period, rel=0.05)
    # Duty resolves to one sample per period (worst when samples and period align exactly).
    assert found.duty == pytest.approx(duty, abs=0.03 + 0.05 / period)
    assert found.compute_w == pytest.approx(650 * cap, rel=0.05)


def test_a_flat_trace_has_no_waveform():
    with pytest.raises(FlexModelError, match="flat"):
        estimate_waveform(np.full(500, 600.0), 0.1)


def test_phase_tracks_the_iteration_and_refuses_a_coarse_reading():
    t, power, cycle = trace(2.0, 0.5, 0.02, 60.0, noise=5.0)
    phase = estimate_phase(power, 0.02, 2.0)
    assert phase is not None
    # Phase 0 is mid-compute (the fundamental's peak): compare against the true cycle.
    truth = 2 * np.pi * (cycle - 0.25)
    middle = slice(len(t) // 4, 3 * len(t) // 4)  # away from the filter's edges
    error = np.angle(np.exp(1j * (phase[middle] - truth[middle])))
    assert np.abs(error).max() < 0.25
    assert estimate_phase(power, 0.02, 2.0, averaging_s=1.0) is None  # NVML's 1 s average


def test_order_parameters():
    assert order_parameters(np.zeros(10)) == pytest.approx([1.0, 1.0, 1.0])
    splay = 2 * np.pi * np.arange(12) / 12
    assert order_parameters(splay) == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    clusters = np.repeat([0.0, 2 * np.pi / 3, 4 * np.pi / 3], 4)
    r1, _, r3 = order_parameters(clusters)
    assert r1 == pytest.approx(0.0, abs=1e-12)
    assert r3 == pytest.approx(1.0)


def test_rayleigh_alarm_holds_for_three_windows_and_clears():
    assert rayleigh_threshold(100, 0.01) == pytest.approx(np.sqrt(np.log(300) / 100))
    alarm = RayleighAlarm(false_alarm=0.01, hold=3)
    rng = np.random.default_rng(0)
    locked = rng.normal(0.0, 0.1, 50)
    assert alarm.update(locked) == [False, False, False]
    assert alarm.update(locked) == [False, False, False]
    assert alarm.update(locked)[0] is True
    assert alarm.update(rng.uniform(0, 2 * np.pi, 50))[0] is False
    with pytest.raises(FlexModelError, match="needs 8 jobs"):
        alarm.update(np.zeros(5))


def test_false_alarm_rate_of_the_rayleigh_threshold():
    rng = np.random.default_rng(1)
    r = order_parameters(rng.uniform(0, 2 * np.pi, (4000, 30)))
    false = np.mean((r > rayleigh_threshold(30, 0.05)).any(axis=1))
    assert (
        false < 0.08
    )  # p split over three harmonics: about 5% overall, a little above for small N


def test_phase_locking_value():
    t = np.linspace(0, 100, 2000)
    assert phase_locking_value(t, t + 1.3) == pytest.approx(1.0)
    rng = np.random.default_rng(2)
    assert phase_locking_value(rng.uniform(0, 2 * np.pi, 2000), t) < 0.1
    with pytest.raises(FlexModelError):
        phase_locking_value([1.0, 2.0], [1.0])


def _slow_edged(seed, ramp, hold, duty, period_s=6.0, dt_s=0.01, periods=8):
    """A compute/idle loop sampled at 100 Hz like the real V100 traces: idle at 58 W, compute
    drawing 150 W for its first 30% then 200 W, edges rising linearly over `ramp` samples
    (the share of time above the midpoint of the two levels is `duty`), noise, and each
    reading held for `hold` samples."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(periods * period_s / dt_s)) * dt_s
    phase = (t % period_s) / period_s
    r = ramp * dt_s / period_s
    frac = np.minimum(np.clip((phase + r / 2) / r, 0, 1), np.clip((duty - phase + r / 2) / r, 0, 1))
    high = np.where(phase < 0.3 * duty, 150.0, 200.0) + 4.0 * rng.standard_normal(t.size)
    low = 58.0 + 2.0 * rng.standard_normal(t.size)
    x = low + (high - low) * frac
    return x[(np.arange(t.size) // hold) * hold]


@pytest.mark.parametrize("ramp", [1, 3, 5, 10])
@pytest.mark.parametrize("hold", [1, 3])
@pytest.mark.parametrize("duty", [0.5, 0.9, 0.93])
def test_the_duty_is_the_share_above_the_levels_midpoint_on_slow_edges(ramp, hold, duty):
    """Issue 34, case 5: Otsu's threshold fell inside a compute phase of two sub-levels and
    read 0.65 for 0.93; the duty is now the share above the midpoint of the two levels."""
    found = estimate_waveform(_slow_edged(ramp * 10 + hold, ramp, hold, duty), 0.01)
    assert found.period_s == pytest.approx(6.0, rel=0.002)
    assert found.duty == pytest.approx(duty, abs=0.01)
    assert found.comm_w == pytest.approx(58.0, abs=2.0)
