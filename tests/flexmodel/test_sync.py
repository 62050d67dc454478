import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.allocate import allocate_mix
from flexmodel.curves import throughput_at_power
from flexmodel.errors import FlexModelError
from flexmodel.harmonics import harmonic_power
from flexmodel.jobmix import parse_job_mix
from flexmodel.loopresponse import DELAY_FACTOR_TERMS, ClosedLoopResponse, LoopResponse, window_gain
from flexmodel.loops import ControlLoop, detune, required_spread, scatter, site_loops
from flexmodel.sync import analyse, analyse_loop, rate_coupling_per_s, worst_verdict


def test_harmonic_power_and_signed_window_gain_by_hand():
    assert harmonic_power(1, 0.5) == pytest.approx(1 / np.pi**2)
    assert harmonic_power(2, 0.5) == pytest.approx(0.0, abs=1e-30)
    assert harmonic_power(3, 0.25) == pytest.approx(np.sin(0.75 * np.pi) ** 2 / (3 * np.pi) ** 2)
    assert window_gain(1, 2.0, 0.0) == 1.0
    # x = m * w * W / 2 = pi * W / T; W = 1.5 T puts the fundamental on a negative side lobe.
    assert window_gain(1, 2.0, 3.0) == pytest.approx(np.sin(1.5 * np.pi) / (1.5 * np.pi))
    assert window_gain(1, 2.0, 3.0) < 0


def test_the_contract_example():
    doc = analyse(2.0, 0.5, delay_s=0.2, gain_per_s=0.05).job_dict(0)
    assert doc["verdict"] == "safe"
    assert doc["in_phase_stable"] is False
    assert doc["max_safe_delay_s"] == pytest.approx(1 / 3)
    first = doc["harmonics"][0]
    assert first["weight"] == pytest.approx(0.101, abs=5e-4)
    assert first["coupling_per_s"] == pytest.approx(-0.05 * np.sin(0.2 * np.pi))
    assert [h["significant"] for h in doc["harmonics"]] == [True, False, True, False, False]
    assert first["critical_coupling_per_s"] is None


@pytest.mark.parametrize(
    ("delay", "attracts"), [(0.2, False), (0.9, False), (1.1, True), (1.9, True)]
)
def test_the_fundamental_attracts_beyond_half_a_period(delay, attracts):
    result = analyse(2.0, 0.5, delay_s=delay)
    assert bool(result.attractive[0, 0]) is attracts
    assert bool(result.in_phase_stable[0]) is attracts


def test_a_delay_that_spares_the_fundamental_can_make_harmonic_3_attract():
    result = analyse(2.0, 0.5, delay_s=0.5)  # w tau = pi/2
    assert not result.attractive[0, 0]
    assert result.attractive[0, 2]
    assert result.verdict == ["unsafe"]


@pytest.mark.parametrize("duty", [0.3, 0.7])
def test_exact_criterion_has_a_neutral_band(duty):
    """d' = min(d, 1-d) = 0.3: repulsive below 0.3 T, neutral up to 0.7 T, attractive above."""
    period = 2.0
    sums = [
        analyse(period, duty, delay_s=f * period).in_phase_sum[0] for f in (0.2, 0.4, 0.5, 0.6, 0.8)
    ]
    assert sums[0] > 0
    assert sums[1] == sums[2] == sums[3] == 0.0  # exactly neutral, not a small number
    assert sums[4] < 0


def test_a_window_of_whole_periods_blinds_the_loop():
    for delay in (0.1, 0.7, 1.3, 1.9):
        result = analyse(2.0, 0.5, delay_s=delay, window_s=6.0)
        assert result.verdict == ["safe"]
        assert not result.significant.any()


def test_a_negative_side_lobe_flips_attraction():
    plain = analyse(2.0, 0.5, delay_s=0.0, window_s=0.0)
    lobe = analyse(2.0, 0.5, delay_s=0.0, window_s=3.0)  # F_1 < 0, tau_eff = 1.5 s
    assert not plain.attractive[0, 0]
    # sin(w * 1.5) < 0 and F_1 < 0: the product is positive, so the fundamental repels...
    assert lobe.coupling_per_s[0, 0] < 0
    flipped = analyse(2.0, 0.5, delay_s=1.0, window_s=3.0)  # tau_eff = 2.5 s, sin > 0
    assert flipped.coupling_per_s[0, 0] > 0  # ...and attracts where a plain loop would repel


def test_spread_turns_unsafe_into_at_risk_and_scales_linearly():
    tau = 1.5  # w tau = 3 pi / 2: the fundamental attracts with strength K
    assert analyse(2.0, 0.5, delay_s=tau, gain_per_s=0.05).verdict == ["unsafe"]
    assert analyse(2.0, 0.5, delay_s=tau, gain_per_s=0.05, spread=0.05).verdict == ["at-risk"]
    small = analyse(2.0, 0.5, delay_s=tau, spread=1e-4).critical_per_s[0, 0]
    double = analyse(2.0, 0.5, delay_s=tau, spread=2e-4).critical_per_s[0, 0]
    assert small == pytest.approx(2 * 1e-4 * np.pi, rel=1e-3)  # 2 gamma, gamma = spread * w
    assert double / small == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize(("duty", "delay", "m"), [(0.5, 0.5, 3), (0.25, 0.75, 2)])
def test_a_harmonic_locks_at_the_fundamentals_threshold_not_m_times_it(duty, delay, m):
    """In m*phi the spread and the coupling both scale by m: the onset is 2 gamma
    exp(m gamma tau), the same attraction as the fundamental's (docs/sync.md)."""
    spread, period = 0.005, 2.0
    gamma = spread * 2 * np.pi / period
    result = analyse(period, duty, delay_s=delay, spread=spread, gain_per_s=0.4)
    assert result.attractive[0, m - 1]
    assert result.critical_per_s[0, m - 1] == pytest.approx(2 * gamma * np.exp(m * gamma * delay))


def test_the_issue_example_is_unsafe_where_the_simulator_locks_harmonic_3():
    """T = 2 s, d = 0.5, tau = 0.5 s, spread 0.005: harmonic 3 locks from gain 0.29 rad/s."""
    check = {"delay_s": 0.5, "spread": 0.005}
    assert analyse(2.0, 0.5, gain_per_s=0.4, **check).verdict == ["unsafe"]
    assert analyse(2.0, 0.5, gain_per_s=0.25, **check).verdict == ["at-risk"]
    unit = analyse(2.0, 0.5, gain_per_s=1.0, **check)
    critical_gain = unit.critical_per_s[0, 2] / unit.coupling_per_s[0, 2]
    assert critical_gain == pytest.approx(0.29, abs=0.005)


@settings(max_examples=40, deadline=None)
@given(
    period=st.floats(0.5, 10.0),
    duty=st.floats(0.1, 0.9),
    delay=st.floats(0.0, 10.0),
    gain=st.floats(0.01, 1.0),
)
def test_the_required_spread_puts_the_worst_harmonic_on_its_threshold(period, duty, delay, gain):
    need = required_spread(analyse(period, duty, delay_s=delay, gain_per_s=gain))
    if need == 0.0:
        assert analyse(period, duty, delay_s=delay, gain_per_s=gain).verdict == ["safe"]
        return
    at = analyse(period, duty, delay_s=delay, gain_per_s=gain, spread=need)
    attract = at.attractive & at.significant
    assert np.all(at.coupling_per_s[attract] <= at.critical_per_s[attract] * (1 + 1e-9))
    assert np.any(np.isclose(at.coupling_per_s[attract], at.critical_per_s[attract], rtol=1e-6))


def test_fleet_analysis_matches_job_by_job():
    periods, duties = np.array([1.0, 2.5, 7.0]), np.array([0.3, 0.5, 0.8])
    fleet = analyse(periods, duties, delay_s=0.8, window_s=0.4, spread=0.01)
    for j in range(3):
        alone = analyse(periods[j], duties[j], delay_s=0.8, window_s=0.4, spread=0.01)
        np.testing.assert_allclose(fleet.coupling_per_s[j], alone.coupling_per_s[0])
        assert fleet.verdict[j] == alone.verdict[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"duty": 1.0}, "duty"),
        ({"period_s": 0.0}, "period_s"),
        ({"delay_s": -1.0}, "delay_s"),
        ({"spread": float("nan")}, "spread"),
    ],
)
def test_bad_analysis_input(kwargs, message):
    args = {"period_s": 2.0, "duty": 0.5, "delay_s": 0.2} | kwargs
    with pytest.raises(FlexModelError, match=message):
        analyse(args.pop("period_s"), args.pop("duty"), **args)


def test_site_loops_and_their_verdicts():
    site = ClosedLoopResponse(period_s=1.0, gain=0.5, window_s=2.0, lag_s=3.0)
    loops = site_loops(site_loop=site, agent_delay_s=1.2)
    names = [loop.name for loop in loops]
    assert names == ["firmware", "agent-node-budget", "gateway"]
    assert loops[-1].response is site  # the site loop as it runs, closed
    assert [loop.name for loop in site_loops(site_loop=None)] == ["firmware"]
    verdicts = {loop.name: loop.evaluate([2.0, 3.0], [0.5, 0.5])["verdict"] for loop in loops}
    assert verdicts["firmware"] == "safe"
    assert verdicts["agent-node-budget"] == "unsafe"  # 1.2 s > T/2 for the 2 s job


def test_a_loop_judges_alike_jobs_once_with_the_same_verdict():
    """`evaluate` judges each (period, duty, coupling) once: the same answer as job by job."""
    loop = ControlLoop("gateway", ClosedLoopResponse(1.0, 0.3, 0.5, 0.6), couples_jobs=True)
    periods, duties = [2.0, 2.0, 3.0, 2.0], [0.5, 0.5, 0.4, 0.5]
    units = [0.05, 0.05, 0.02, 0.1]
    whole = loop.evaluate(periods, duties, gain_per_s=units)
    alone = [
        loop.evaluate([t], [d], gain_per_s=[u])
        for t, d, u in zip(periods, duties, units, strict=True)
    ]
    assert whole["coupling_per_s"] == max(a["coupling_per_s"] for a in alone)
    assert whole["verdict"] == worst_verdict([a["verdict"] for a in alone])


def test_an_integrating_site_loop_is_judged_at_its_real_gain_per_job():
    """The site loop integrates: at 0.45 T of a 2 s job it attracts (a proportional loop with
    the same delay would not), with the coupling from each job's own swing and rate per watt."""
    periods, duties = np.array([2.0, 2.0]), np.array([0.5, 0.5])
    unit = rate_coupling_per_s(periods, duties, swing_w=[2000.0, 0.0], rate_per_w=1e-4)
    site = ControlLoop(
        "site-tracking",
        LoopResponse(delay_s=0.9, proportional_gain=0.0, integral_gain_per_s=0.5),
        couples_jobs=True,
    )
    assert site.evaluate(periods[:1], duties[:1], gain_per_s=unit[:1])["verdict"] == "unsafe"
    assert site.evaluate(periods[1:], duties[1:], gain_per_s=unit[1:])["verdict"] == "safe"
    proportional = ControlLoop("p", LoopResponse(delay_s=0.9), couples_jobs=True)
    assert proportional.evaluate(periods, duties, gain_per_s=unit)["verdict"] == "safe"


def test_scattering_spreads_rates_enough_and_prices_it():
    mix = parse_job_mix(
        {
            "jobs": [
                {
                    "id": f"j{i}",
                    "gpus": 8,
                    "power_w": 600,
                    "throughput": 1e4 * (i + 1),
                    "pfi": 1.4,
                    "period_s": 2.0,
                    "duty": 0.5,
                }
                for i in range(6)
            ]
        }
    )
    loop = ControlLoop("agent-node-budget", LoopResponse(delay_s=1.5), couples_jobs=True)
    plan = scatter(mix, loop, gain_per_s=0.05, budget_fraction=0.2)
    assert plan["required_spread"] > 0
    offsets = [j["rate_offset"] for j in plan["jobs"]]
    assert min(offsets) < 0 == max(offsets)  # rates can only be lowered
    # The job with the most throughput is slowed least.
    assert offsets[-1] == 0.0
    assert plan["throughput_cost"] > 0
    assert plan["feasible"] == (plan["throughput_cost_fraction"] <= 0.2)
    assert all(j["cap_w"] <= 700.0 for j in plan["jobs"])
    safe = ControlLoop("gateway", LoopResponse(delay_s=5.0, window_s=6.0), couples_jobs=True)
    assert scatter(mix, safe)["throughput_cost"] == 0.0


def detuning_mix():
    return parse_job_mix(
        {
            "jobs": [
                {
                    "id": f"j{i}",
                    "gpus": 8,
                    "power_w": 600,
                    "throughput": 1e4 * (1 + i % 5),
                    "pfi": 1.2 + 0.1 * (i % 7),
                    "period_s": 2.0,
                    "duty": 0.5,
                    "min_throughput_fraction": 0.9 if i == 3 else 0.0,
                    "protected": i == 5,
                }
                for i in range(20)
            ]
        }
    )


def test_detuning_during_an_event_keeps_the_power_and_spreads_the_rates():
    mix = detuning_mix()
    allocation = allocate_mix(mix, 0.2 * mix.overhead_factor * 20 * 8 * 600 / 1000)
    power = np.array([j["power_w"] for j in allocation["jobs"]])
    tuned = detune(mix.problem, power, 0.02, hold_power=True)
    assert tuned.power_change_w == pytest.approx(0.0, abs=1.0)  # of 77 kW
    spread = tuned.rate_offset.max() - tuned.rate_offset.min()
    # at least the spread asked for: the capped jobs are sped up on top of their offsets
    assert spread >= 0.04 - 1e-9
    assert tuned.rate_offset[5] == 0.0  # protected
    assert tuned.power_w[5] == power[5]
    # within every job's bounds: the QoS floor holds and nothing goes past uncapped
    floor = mix.array("min_throughput_fraction") * mix.curves.uncapped_throughput
    assert np.all(tuned.throughput >= np.minimum(floor, throughput_at_power(mix.curves, power)))
    assert np.all(tuned.power_w <= mix.curves.uncapped_power_w + 1e-9)
    # speeding some jobs pays for slowing others: the allocation's optimum moved a little,
    # at a fraction of the 2% that slowing alone costs (0.3% here)
    assert 0.0 <= tuned.throughput_cost < 0.005 * allocation["throughput_after"]


def test_detuning_outside_events_only_slows_and_costs_about_the_spread():
    mix = detuning_mix()
    tuned = detune(mix.problem, mix.curves.uncapped_power_w, 0.01, hold_power=False)
    assert tuned.rate_offset.max() == 0.0
    assert tuned.rate_offset.min() == pytest.approx(-0.02)
    assert tuned.power_change_w < 0
    fraction = tuned.throughput_cost / mix.curves.uncapped_throughput.sum()
    # evenly spaced in [-2%, 0], the slowest on the smallest jobs: under the mean 1%
    assert 0.005 < fraction < 0.01


@pytest.mark.parametrize("half_width", [-0.01, 0.6, math.nan])
def test_an_impossible_detuning_is_refused(half_width):
    mix = detuning_mix()
    with pytest.raises(FlexModelError, match="half_width"):
        detune(mix.problem, mix.curves.uncapped_power_w, half_width, hold_power=False)


@settings(max_examples=60, deadline=None)
@given(
    period=st.floats(0.5, 10.0),
    duty=st.floats(0.05, 0.95),
    delay=st.floats(0.0, 10.0),
    window=st.floats(0.0, 10.0),
    gain=st.floats(1e-3, 1.0),
    spread=st.floats(0.0, 0.05),
)
def test_the_proportional_loop_is_a_special_case_of_the_general_response(
    period, duty, delay, window, gain, spread
):
    """A unit proportional gain behind a delay and a window gives today's formulas:
    a_m = -K (|c_m|^2/|c_1|^2) F_m sin(m w (tau + W/2)), weight |c_m|^2 F_m, significance
    |c_m|^2 |F_m| >= 0.1 |c_1|^2."""
    loop = LoopResponse(delay_s=delay, window_s=window)
    general = analyse_loop(period, duty, loop, unit_coupling_per_s=gain, spread=spread)
    m = np.arange(1, 6)
    w = 2 * np.pi / period
    power, filters = harmonic_power(m, duty), window_gain(m, period, window)
    expected = -gain * power / power[0] * filters * np.sin(m * w * (delay + window / 2))
    np.testing.assert_allclose(general.coupling_per_s[0], expected, rtol=1e-9, atol=1e-12 * gain)
    np.testing.assert_allclose(general.weight[0], power * filters, atol=1e-12 * power[0])
    assert list(general.significant[0]) == list(
        power * np.abs(filters) >= 0.1 * power[0] * (1 - 1e-12)
    )
    np.testing.assert_allclose(
        loop.response(m * w), filters * np.exp(-1j * m * w * (delay + window / 2)), atol=1e-12
    )
    assert general.job_dict(0) == analyse(
        period, duty, delay_s=delay, window_s=window, spread=spread, gain_per_s=gain
    ).job_dict(0)


def test_integral_action_adds_a_quarter_period_lag_and_a_gain_falling_as_1_over_m_w():
    """a_m = -K (|c_m|^2/|c_1|^2) (k_i / (m w)) F_m cos(m w tau_eff) (docs/sync.md)."""
    period, duty, delay, window, ki = 2.0, 0.3, 0.7, 0.4, 1.5
    loop = LoopResponse(
        delay_s=delay, window_s=window, proportional_gain=0.0, integral_gain_per_s=ki
    )
    result = analyse_loop(period, duty, loop, unit_coupling_per_s=0.2)
    m, w = np.arange(1, 6), 2 * np.pi / period
    power = harmonic_power(m, duty)
    expected = (
        -0.2
        * power
        / power[0]
        * ki
        / (m * w)
        * window_gain(m, period, window)
        * np.cos(m * w * (delay + window / 2))
    )
    np.testing.assert_allclose(result.coupling_per_s[0], expected)


@pytest.mark.parametrize(
    ("delay", "integral_attracts", "proportional_attracts"),
    [
        (0.3, False, False),
        (0.7, True, False),
        (1.2, True, True),
        (1.7, False, True),
        (2.7, True, False),
    ],
)
def test_an_integrating_loop_attracts_for_a_quarter_to_three_quarters_of_a_period(
    delay, integral_attracts, proportional_attracts
):
    """T = 2 s, d = 0.5: the integrator's fundamental attracts for T/4 < tau < 3T/4, the
    proportional throttle's for T/2 < tau < T; both repeat every period (tau = 2.7 s)."""
    integral = LoopResponse(delay_s=delay, proportional_gain=0.0, integral_gain_per_s=1.0)
    result = analyse_loop(2.0, 0.5, integral, unit_coupling_per_s=0.1)
    assert bool(result.attractive[0, 0]) is integral_attracts
    assert bool(result.in_phase_stable[0]) is integral_attracts
    assert bool(analyse(2.0, 0.5, delay_s=delay).attractive[0, 0]) is proportional_attracts


def test_an_integrating_loops_delay_limit_is_a_quarter_period():
    """Harmonic 3 of the integrator weighs (1/9)/3 of the fundamental: not significant."""
    integral = LoopResponse(proportional_gain=0.0, integral_gain_per_s=1.0)
    result = analyse_loop(2.0, 0.5, integral, unit_coupling_per_s=0.1)
    assert result.max_safe_delay_s[0] == pytest.approx(0.5)
    assert list(result.significant[0]) == [True, False, False, False, False]


loops = st.builds(
    LoopResponse,
    delay_s=st.floats(0.0, 8.0),
    window_s=st.sampled_from([0.0]) | st.floats(0.05, 5.0),
    hold_s=st.sampled_from([0.0]) | st.floats(0.05, 2.0),
    proportional_gain=st.sampled_from([0.0, 1.0]) | st.floats(0.0, 2.0),
    integral_gain_per_s=st.sampled_from([0.0]) | st.floats(0.0, 2.0),
)


@settings(max_examples=60, deadline=None)
@given(duty=st.floats(0.05, 0.95), loop=loops)
def test_closed_form_matches_the_series_for_any_loop(duty, loop):
    """S = -sum_m m |c_m|^2 Im H(i m w), summed far out, for delay, window, hold, P and I."""
    period = 2 * np.pi  # w = 1
    pulse = 2 * np.pi * duty
    edges = np.array([0.0, pulse, 2 * np.pi - pulse, 2 * np.pi])
    smeared = loop.window_s > 0 or loop.hold_s > 0
    if not smeared and np.min(np.abs(np.mod(loop.delay_s, 2 * np.pi) - edges)) < 0.02:
        return  # the series converges slowly at a step; the closed form is exact there
    exact = analyse_loop(period, duty, loop, unit_coupling_per_s=1.0).in_phase_sum[0]
    m = np.arange(1, 200_001, dtype=float)
    series = -np.sum(m * harmonic_power(m, duty) * np.imag(loop.response(m)))
    assert series == pytest.approx(exact, abs=3e-4 * (1 + loop.integral_gain_per_s))


@settings(max_examples=80, deadline=None)
@given(period=st.floats(0.5, 10.0), duty=st.floats(0.1, 0.9), loop=loops)
def test_max_safe_delay_is_where_attraction_starts_for_any_loop(period, duty, loop):
    def analysis(delay):
        moved = dataclasses.replace(loop, delay_s=delay)
        return analyse_loop(period, duty, moved, unit_coupling_per_s=0.05)

    limit = analysis(0.0).max_safe_delay_s[0]
    if not np.isfinite(limit):
        return
    step = 1e-6 * period
    if limit > step:
        assert analysis(limit - step).verdict == ["safe"]
    assert analysis(limit + step).verdict != ["safe"]


def test_the_loops_gain_becomes_the_coupling_through_the_jobs_rate_per_watt():
    """K = 2 w |c_1|^2 swing_w rate_per_w; a loop of gain k then couples k times as hard."""
    unit = rate_coupling_per_s(2.0, 0.5, swing_w=2000.0, rate_per_w=1e-4)
    assert unit == pytest.approx(2 * np.pi * (1 / np.pi**2) * 2000 * 1e-4)
    weak = analyse_loop(
        2.0, 0.5, LoopResponse(1.5, proportional_gain=1.0), unit_coupling_per_s=unit
    )
    strong = analyse_loop(
        2.0, 0.5, LoopResponse(1.5, proportional_gain=3.0), unit_coupling_per_s=unit
    )
    np.testing.assert_allclose(strong.coupling_per_s, 3 * weak.coupling_per_s)
    assert strong.gain_per_s[0] == pytest.approx(3 * unit)


def test_bad_loop_input():
    with pytest.raises(FlexModelError, match="integral_gain_per_s"):
        LoopResponse(integral_gain_per_s=-1.0)
    with pytest.raises(FlexModelError, match="hold_s"):
        LoopResponse(hold_s=float("inf"))


def test_a_measured_delay_is_judged_on_its_whole_distribution():
    """Harmonic 3 of a 2 s job at duty 0.5 attracts a delayed throttle for tau in (T/6, T/3)
    modulo T/3. Delays of 0.1 s and 0.55 s average to 0.325 s, just outside that window; half
    of them sit inside it, and the distribution attracts where its mean does not."""
    fixed = LoopResponse(delay_s=0.325)
    spread = LoopResponse.measured([0.1, 0.55])
    assert spread.delay_s == pytest.approx(0.325)
    at_mean = analyse_loop(2.0, 0.5, fixed, unit_coupling_per_s=1.0)
    measured = analyse_loop(2.0, 0.5, spread, unit_coupling_per_s=1.0)
    assert worst_verdict(at_mean.verdict) == "safe"
    assert measured.attractive[0, 2]  # harmonic 3
    assert worst_verdict(measured.verdict) != "safe"
    # One sample is the fixed delay.
    one = analyse_loop(2.0, 0.5, LoopResponse.measured([0.325]), unit_coupling_per_s=1.0)
    np.testing.assert_allclose(one.coupling_per_s, at_mean.coupling_per_s, atol=1e-12)
    np.testing.assert_allclose(one.in_phase_sum, at_mean.in_phase_sum, atol=1e-12)


def test_a_delay_distribution_must_be_delays():
    with pytest.raises(FlexModelError, match="finite"):
        LoopResponse.measured([0.1, math.nan])
    with pytest.raises(FlexModelError, match="delay_samples_s"):
        LoopResponse(delay_s=0.0, delay_samples_s=(-1.0, 1.0))
    with pytest.raises(FlexModelError, match="at least one sample"):
        LoopResponse.measured([])
    with pytest.raises(FlexModelError, match="mean"):
        LoopResponse(delay_s=1.0, delay_samples_s=(0.1, 0.2))


def test_a_delay_distribution_is_averaged_the_same_in_slices_as_at_once():
    """`delay_factor` works through the frequencies a slice at a time: more frequencies than
    one slice holds, and a last slice cut short, give E[exp(-i w tau)] exactly."""
    rng = np.random.default_rng(7)
    samples = tuple(float(v) for v in rng.uniform(0.01, 2.0, 64))
    loop = LoopResponse.measured(samples)
    slice_rows = DELAY_FACTOR_TERMS // len(samples)
    w = rng.uniform(0.1, 30.0, (slice_rows * 2 + 37, 5))
    expected = np.exp(-1j * w[..., None] * np.asarray(samples)).mean(axis=-1)
    np.testing.assert_allclose(loop.delay_factor(w), expected, rtol=0, atol=1e-15)
    assert loop.delay_factor(w[0, 0]).shape == ()
