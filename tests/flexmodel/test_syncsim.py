"""The simulator reproduces what the phase-locking study claims (docs/sync.md)."""

import numpy as np
import pytest

from flexmodel.errors import FlexModelError
from flexmodel.locking import gain_sweep, locking_gain
from flexmodel.phases import rayleigh_threshold
from flexmodel.sync import analyse
from flexmodel.syncsim import simulate_sync

T = 2.0


def two_jobs(delay_s, *, duty=0.5, start=0.1, gain=0.3, seconds=300.0, **loop):
    run = simulate_sync(
        jobs=2,
        period_s=T,
        duty=duty,
        delay_s=delay_s,
        gain_per_s=gain,
        duration_s=seconds,
        initial_phases=np.array([0.0, start]),
        **loop,
    )
    return run.phase_difference / (2 * np.pi)  # in cycles, [0, 0.5]


@pytest.mark.parametrize("delay", [0.2, 0.6, 0.9])
def test_two_equal_jobs_settle_in_anti_phase_below_half_a_period(delay):
    assert two_jobs(delay) == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize("delay", [1.1, 1.4, 1.8])
def test_two_equal_jobs_settle_in_phase_above_half_a_period(delay):
    assert two_jobs(delay) == pytest.approx(0.0, abs=0.02)


#: An integrator of the same strength at the fundamental as a unit proportional gain.
INTEGRAL = {"proportional_gain": 0.0, "integral_gain_per_s": 2 * np.pi / T}


@pytest.mark.parametrize(("loop", "difference"), [(INTEGRAL, 0.0), ({}, 0.5)])
def test_at_045_periods_an_integrating_loop_locks_two_jobs_in_phase_a_proportional_one_not(
    loop, difference
):
    """The integrator's quarter-period lag moves the attractive window to (T/4, 3T/4)."""
    assert two_jobs(0.45 * T, start=0.3, gain=0.2, **loop) == pytest.approx(difference, abs=0.02)


PI = {"proportional_gain": 1.0, "integral_gain_per_s": 2 * np.pi / T}


@pytest.mark.parametrize(
    ("delay", "loop"),
    [
        (0.6, {}),
        (1.4, {}),
        (0.7, {"hold_s": 0.4}),  # the hold's half-width puts tau_eff at 0.9 s: repulsive
        (0.9, {"hold_s": 0.4}),  # ... and at 1.1 s: attractive
        (0.3, INTEGRAL),
        (0.9, INTEGRAL),
        (1.7, INTEGRAL),
        (2.7, INTEGRAL),  # the windows repeat every period: 2.7 s acts as 0.7 s
        (0.0, INTEGRAL | {"window_s": 0.6}),
        (0.4, INTEGRAL | {"window_s": 0.6}),
        (0.5, PI),
        (1.0, PI),
    ],
)
def test_the_analysis_and_the_simulator_agree_on_the_two_job_verdict(delay, loop):
    """Two jobs 0.1 cycles apart end in phase exactly where the analysis of the same loop
    (`sync.analyse`, all harmonics) calls in phase stable, and are pushed apart elsewhere."""
    stable = analyse(T, 0.5, delay_s=delay, **loop).in_phase_stable[0]
    difference = two_jobs(delay, gain=0.15, **loop)
    if stable:
        assert difference < 0.03
    else:
        assert difference > 0.2


@pytest.mark.parametrize(
    ("delay", "loop", "m"),
    [(0.5, {}, 3), (1.5, {}, 1), (0.9, INTEGRAL, 1), (0.45, {"hold_s": 0.1}, 3)],
)
def test_the_harmonic_the_analysis_finds_attractive_is_the_one_the_fleet_locks_on(delay, loop, m):
    """Nine identical jobs from random phases: the one significant attractive harmonic of the
    analysis is the one they lock on (for m = 3, three clusters a third of a period apart,
    so the fundamental stays unlocked)."""
    result = analyse(T, 0.5, delay_s=delay, **loop)
    attractive = result.attractive[0] & result.significant[0]
    assert list(np.flatnonzero(attractive) + 1) == [m]
    run = simulate_sync(
        jobs=9, period_s=T, duty=0.5, delay_s=delay, gain_per_s=0.2, duration_s=400, seed=3, **loop
    )
    r1, _, r3 = run.final_order
    assert (r1 if m == 1 else r3) > 0.8
    if m == 3:
        assert r1 < 0.3


def test_duty_below_half_repels_then_is_neutral_then_attracts():
    """d = 0.3: d'T = 0.6 s, (1 - d')T = 1.4 s; start 0.05 cycles apart."""
    assert two_jobs(0.3, duty=0.3, start=0.05) > 0.3  # repelled far apart
    for delay in (0.8, 1.0, 1.2):  # neutral: a small difference neither grows nor shrinks
        assert two_jobs(delay, duty=0.3, start=0.05) == pytest.approx(0.05, abs=0.01)
    assert two_jobs(1.6, duty=0.3, start=0.05) == pytest.approx(0.0, abs=0.01)


def test_a_quarter_period_delay_forms_three_clusters():
    run = simulate_sync(
        jobs=9, period_s=T, duty=0.5, delay_s=T / 4, gain_per_s=0.5, duration_s=400, seed=2
    )
    r1, _, r3 = run.final_order
    assert r1 < 0.2
    assert r3 > 0.8


def test_an_attractive_delay_locks_a_fleet_and_its_swing_grows_like_n():
    jobs = 50
    locked = simulate_sync(
        jobs=jobs, period_s=T, duty=0.5, delay_s=1.5, gain_per_s=0.3, duration_s=300, seed=4
    )
    assert locked.final_order[0] > 0.99
    assert locked.swing_ratio == pytest.approx(np.sqrt(jobs), rel=0.05)
    free = simulate_sync(
        jobs=jobs, period_s=T, duty=0.5, delay_s=0.2, gain_per_s=0.3, duration_s=300, seed=4
    )
    assert np.all(free.final_order < rayleigh_threshold(jobs, 0.01))
    assert free.swing_ratio < 1.5


def critical_gain(duty, delay_s, m, spread):
    """The gain at which the analysis puts harmonic m on its locking threshold."""
    unit = analyse(T, duty, delay_s=delay_s, spread=spread, gain_per_s=1.0)
    return unit.critical_per_s[0, m - 1] / unit.coupling_per_s[0, m - 1]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    ("duty", "delay", "m"),
    [(0.5, 0.5, 3), (0.25, 0.75, 2)],  # w tau = pi/2 for harmonic 3, 3 pi/4 for harmonic 2
)
def test_a_harmonic_locks_where_the_analysis_puts_its_threshold(duty, delay, m, seed):
    """300 jobs, spread 0.005: below 0.7 times the critical gain r_m stays at the level of
    random phases; above 1.4 times it the fleet locks on harmonic m (the fundamental does not).
    The old threshold (m times higher) would put both gains below the onset."""
    spread = 0.005
    gain = critical_gain(duty, delay, m, spread)

    def order(factor):
        run = simulate_sync(
            jobs=300,
            period_s=T,
            duty=duty,
            delay_s=delay,
            gain_per_s=factor * gain,
            spread=spread,
            duration_s=600,
            seed=seed,
        )
        return run.final_order

    assert order(0.7)[m - 1] < 0.2
    locked = order(1.4)
    assert locked[m - 1] > 0.4
    assert locked[0] < 0.2


def test_the_locking_threshold_grows_linearly_with_the_spread():
    """Theory: K_c = 2 gamma = 2 * spread * w at w tau = 3 pi / 2. What we see: a straight line
    with slope near 2 w, plus a small offset (300 jobs and 300 s: finite N and finite time
    need a little more coupling to reach r1 = 0.4)."""
    spreads = np.array([0.005, 0.01, 0.02, 0.03])
    gains = np.array([locking_gain(s) for s in spreads])
    slope, offset = np.polyfit(spreads, gains, 1)
    fitted = slope * spreads + offset
    assert np.all(np.abs(gains - fitted) < 0.06 * gains)  # a line
    assert slope / (2 * 2 * np.pi / T) == pytest.approx(1.0, abs=0.2)
    assert 0.0 <= offset < 0.3 * gains[0]


def test_sweeping_the_gain_up_and_down_shows_little_hysteresis():
    """What we see: with a Lorentzian spread the onset is close to continuous. Far from the
    threshold both branches agree; near it the locked branch stays at least as ordered."""
    spread = 0.01
    up, down = gain_sweep(spread, np.array([0.4, 0.9, 1.0, 1.2, 2.0]) * 2 * spread * 2 * np.pi / T)
    assert up[0] < 0.2
    assert down[0] < 0.2
    assert up[-1] > 0.65
    assert down[-1] > 0.65
    assert all(d >= u - 0.1 for u, d in zip(up, down, strict=True))
    assert max(d - u for u, d in zip(up, down, strict=True)) < 0.25


def test_output_follows_the_contract():
    doc = simulate_sync(jobs=2, period_s=2.0, duty=0.5, delay_s=1.4, duration_s=60).as_dict()
    assert set(doc) >= {"jobs", "period_s", "duty", "delay_s", "final", "aggregate_swing_ratio"}
    assert set(doc["final"]) == {"r1", "r2", "r3", "phase_difference"}
    assert 0.0 <= doc["final"]["phase_difference"] <= np.pi
    many = simulate_sync(jobs=3, period_s=2.0, duty=0.5, delay_s=1.4, duration_s=60).as_dict()
    assert "phase_difference" not in many["final"]


def test_runs_are_deterministic_by_seed():
    a = simulate_sync(
        jobs=20, period_s=2.0, duty=0.5, delay_s=1.4, spread=0.02, noise=0.01, duration_s=60, seed=7
    )
    b = simulate_sync(
        jobs=20, period_s=2.0, duty=0.5, delay_s=1.4, spread=0.02, noise=0.01, duration_s=60, seed=7
    )
    np.testing.assert_array_equal(a.final_phases, b.final_phases)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jobs": 0}, "jobs"),
        ({"duty": 1.0}, "duty"),
        ({"duration_s": 0.5}, "duration"),
        ({"throttle": "soft"}, "throttle"),
        ({"delay_s": -0.1}, "delay_s"),
        ({"hold_s": -1.0}, "hold_s"),
        ({"integral_gain_per_s": float("nan")}, "integral_gain_per_s"),
    ],
)
def test_bad_simulation_input(kwargs, message):
    args = {"jobs": 2, "period_s": 2.0, "duty": 0.5, "delay_s": 0.2, "duration_s": 10.0} | kwargs
    with pytest.raises(FlexModelError, match=message):
        simulate_sync(**args)
