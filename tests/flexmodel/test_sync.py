import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.loops import ControlLoop, scatter, site_loops
from flexmodel.sync import analyse, harmonic_power, window_gain


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


@settings(max_examples=60, deadline=None)
@given(duty=st.floats(0.05, 0.95), theta=st.floats(0.05, 6.2), window=st.floats(0.0, 3.0))
def test_closed_form_matches_the_harmonic_series(duty, theta, window):
    """S in closed form equals sum_m m |c_m|^2 F_m sin(m w tau_eff) summed far out."""
    period = 2 * np.pi  # w = 1
    pulse = 2 * np.pi * duty
    edges = np.array([0.0, pulse, 2 * np.pi - pulse, 2 * np.pi])
    if window == 0.0 and np.min(np.abs(np.mod(theta, 2 * np.pi) - edges)) < 0.02:
        return  # the series converges slowly at a step; the closed form is exact there
    exact = analyse(period, duty, delay_s=theta, window_s=window).in_phase_sum[0]
    m = np.arange(1, 200_001, dtype=float)
    series = np.sum(
        m
        * harmonic_power(m, duty)
        * window_gain(m, period, window)
        * np.sin(m * (theta + window / 2))
    )
    assert series == pytest.approx(exact, abs=2e-4)


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


@settings(max_examples=80, deadline=None)
@given(period=st.floats(0.5, 10.0), duty=st.floats(0.1, 0.9), window=st.floats(0.0, 2.0))
def test_max_safe_delay_is_where_attraction_starts(period, duty, window):
    limit = analyse(period, duty, delay_s=0.0, window_s=window).max_safe_delay_s[0]
    if not np.isfinite(limit):
        return
    step = 1e-6 * period
    if limit > step:
        assert analyse(period, duty, delay_s=limit - step, window_s=window).verdict == ["safe"]
    assert analyse(period, duty, delay_s=limit + step, window_s=window).verdict != ["safe"]


def test_spread_turns_unsafe_into_at_risk_and_scales_linearly():
    tau = 1.5  # w tau = 3 pi / 2: the fundamental attracts with strength K
    assert analyse(2.0, 0.5, delay_s=tau, gain_per_s=0.05).verdict == ["unsafe"]
    assert analyse(2.0, 0.5, delay_s=tau, gain_per_s=0.05, spread=0.05).verdict == ["at-risk"]
    small = analyse(2.0, 0.5, delay_s=tau, spread=1e-4).critical_per_s[0, 0]
    double = analyse(2.0, 0.5, delay_s=tau, spread=2e-4).critical_per_s[0, 0]
    assert small == pytest.approx(2 * 1e-4 * np.pi, rel=1e-3)  # 2 gamma, gamma = spread * w
    assert double / small == pytest.approx(2.0, rel=1e-3)


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
    loops = site_loops(periods_s=[2.0, 3.0], reconcile_period_s=5.0, agent_delay_s=1.2)
    names = [loop.name for loop in loops]
    assert names == ["firmware", "agent-node-budget", "gateway"]
    gateway = loops[-1]
    assert gateway.window_s == pytest.approx(9.0)  # three of the longest periods
    verdicts = {loop.name: loop.evaluate([2.0, 3.0], [0.5, 0.5])["verdict"] for loop in loops}
    assert verdicts["firmware"] == "safe"
    assert verdicts["agent-node-budget"] == "unsafe"  # 1.2 s > T/2 for the 2 s job


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
    loop = ControlLoop("agent-node-budget", delay_s=1.5, window_s=0.0, couples_jobs=True)
    plan = scatter(mix, loop, gain_per_s=0.05, budget_fraction=0.2)
    assert plan["required_spread"] > 0
    offsets = [j["rate_offset"] for j in plan["jobs"]]
    assert min(offsets) < 0 == max(offsets)  # rates can only be lowered
    # The job with the most throughput is slowed least.
    assert offsets[-1] == 0.0
    assert plan["throughput_cost"] > 0
    assert plan["feasible"] == (plan["throughput_cost_fraction"] <= 0.2)
    assert all(j["cap_w"] <= 700.0 for j in plan["jobs"])
    safe = ControlLoop("gateway", delay_s=5.0, window_s=6.0, couples_jobs=True)
    assert scatter(mix, safe)["throughput_cost"] == 0.0
