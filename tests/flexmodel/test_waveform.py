"""The waveform estimator on traces with real jobs' irregularity (synthetic_traces.py)."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError, NoPeriodError
from flexmodel.phases import estimate_waveform, split_levels
from tests.flexmodel.synthetic_traces import Loop, power_at, uniform_times

HZ = 100.0
TRUE_DUTY = 6.2 / 6.7


def estimate(loop: Loop, seconds: float = 600.0, seed: int = 0, max_period_s: float = 60.0):
    t = uniform_times(seconds, HZ)
    return estimate_waveform(power_at(loop, t, seed), 1 / HZ, max_period_s=max_period_s)


def test_a_short_low_phase_gives_its_duty_and_both_levels():
    """The reported case: 6.2 s compute and 0.5 s idle, where percentiles both fell in compute."""
    found = estimate(Loop())
    assert found.period_s == pytest.approx(6.7, rel=0.002)
    assert found.duty == pytest.approx(TRUE_DUTY, abs=0.005)
    assert found.compute_w == pytest.approx(116.0, abs=0.5)
    assert found.comm_w == pytest.approx(51.0, abs=0.5)
    assert found.confidence > 0.95
    assert found.paused_share == 0.0


def test_a_short_high_phase_gives_its_duty_and_both_levels():
    found = estimate(Loop(duty=0.07, compute_w=300.0, comm_w=100.0, noise_w=5.0))
    assert found.period_s == pytest.approx(6.7, rel=0.002)
    assert found.duty == pytest.approx(0.07, abs=0.005)
    assert found.compute_w == pytest.approx(300.0, abs=1.0)
    assert found.comm_w == pytest.approx(100.0, abs=1.0)


@pytest.mark.parametrize(
    ("loop", "period_rel", "duty_abs"),
    [
        (Loop(jitter=0.03), 0.01, 0.01),
        (Loop(pause_every=30, pause_s=20.0), 0.002, 0.01),  # checkpoints at the idle level
        (Loop(pause_every=25, pause_s=15.0, pause_w=116.0), 0.002, 0.01),  # evaluation, busy
        (Loop(drift_w=10.0, drift_period_s=300.0), 0.002, 0.01),
        (Loop(noise_w=8.0), 0.002, 0.02),
        (
            Loop(jitter=0.03, pause_every=20, pause_s=30.0, drift_w=8.0, drift_period_s=300.0),
            0.02,
            0.015,
        ),
    ],
    ids=["jitter", "checkpoints", "evaluation", "drift", "noise", "all-at-once"],
)
def test_irregular_jobs_keep_period_duty_and_levels(loop, period_rel, duty_abs):
    found = estimate(loop)
    assert found.period_s == pytest.approx(6.7, rel=period_rel)
    assert found.duty == pytest.approx(TRUE_DUTY, abs=duty_abs)
    assert found.compute_w == pytest.approx(116.0, abs=1.5)
    assert found.comm_w == pytest.approx(51.0, abs=1.5)
    if loop.pause_every:
        assert found.paused_share > 0.05  # the pauses were found and set aside


def test_jitter_lowers_the_confidence():
    steady, jittery = estimate(Loop()), estimate(Loop(jitter=0.05))
    assert jittery.confidence < steady.confidence - 0.1


def test_missing_samples_are_left_out_not_invented():
    t = uniform_times(600.0, HZ)
    x = power_at(Loop(), t)
    rng = np.random.default_rng(3)
    x[rng.uniform(size=x.size) < 0.2] = np.nan  # a fifth of the samples lost
    x[20000:20500] = np.nan  # and a five-second gap
    found = estimate_waveform(x, 1 / HZ, max_period_s=60.0)
    assert found.period_s == pytest.approx(6.7, rel=0.002)
    assert found.duty == pytest.approx(TRUE_DUTY, abs=0.01)
    assert found.comm_w == pytest.approx(51.0, abs=0.5)


def _telegraph(n: int, seed: int) -> np.ndarray:
    """Two levels switching at random times: two levels, no period."""
    rng = np.random.default_rng(seed)
    runs = rng.exponential(300.0, n).astype(int) + 1
    levels = np.repeat(np.arange(runs.size) % 2, runs)[:n]
    return 50.0 + 65.0 * levels + rng.normal(0.0, 1.0, n)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("white noise", lambda rng, n: rng.normal(100.0, 5.0, n)),
        ("random walk", lambda rng, n: 100.0 + np.cumsum(rng.normal(0.0, 1.0, n))),
        ("random switching", lambda rng, n: _telegraph(n, 7)),
        ("flat", lambda rng, n: np.full(n, 300.0)),
    ],
)
def test_no_period_is_said_never_invented(name, make):
    rng = np.random.default_rng(5)
    with pytest.raises(NoPeriodError):
        estimate_waveform(make(rng, 60000), 0.01, max_period_s=60.0)


def test_bad_traces_are_refused():
    with pytest.raises(FlexModelError, match="at least 8 finite samples"):
        estimate_waveform([1.0, np.nan, 2.0], 0.1)
    with pytest.raises(FlexModelError, match="interval must be positive"):
        estimate_waveform(np.arange(100.0), 0.0)
    with pytest.raises(FlexModelError, match="at least two of the longest periods"):
        estimate_waveform(np.sin(np.arange(100.0)), 0.1, max_period_s=5.0, min_period_s=5.0)


@settings(max_examples=40, deadline=None)
@given(
    period=st.floats(1.0, 9.0),
    duty=st.floats(0.05, 0.95),
    jitter=st.floats(0.0, 0.02),
    seed=st.integers(0, 1000),
)
def test_duty_lies_in_0_1_and_is_right(period, duty, jitter, seed):
    assume(min(duty, 1 - duty) * period >= 0.2)  # each phase spans a few samples at 20 Hz
    loop = Loop(period_s=period, duty=duty, jitter=jitter, noise_w=2.0)
    t = uniform_times(max(15 * period, 60.0), 20.0)
    found = estimate_waveform(power_at(loop, t, seed), 0.05, max_period_s=12.0)
    assert 0.0 < found.duty < 1.0
    assert found.period_s == pytest.approx(period, rel=0.03)
    assert found.duty == pytest.approx(duty, abs=0.02 + 0.05 / period)
    assert found.compute_w > found.comm_w


@settings(max_examples=80, deadline=None)
@given(
    low=st.floats(30.0, 600.0),
    gap=st.floats(20.0, 400.0),
    share=st.floats(0.01, 0.99),
    noise=st.floats(0.0, 2.0),
    seed=st.integers(0, 1000),
)
def test_a_two_level_split_never_puts_both_levels_in_one_cluster(low, gap, share, noise, seed):
    rng = np.random.default_rng(seed)
    n = 2000
    lows = max(1, min(n - 1, round(share * n)))
    samples = np.concatenate([np.full(lows, low), np.full(n - lows, low + gap)])
    samples = samples + rng.normal(0.0, noise, n)
    threshold = split_levels(samples)
    assert np.all(samples[:lows] < threshold)
    assert np.all(samples[lows:] > threshold)
