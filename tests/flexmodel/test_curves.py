import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmodel.curves import (
    EXPONENT,
    STATIC_SHARE,
    FamilyShape,
    cap_for_power,
    family_curves,
    family_point,
    operating_point,
    power_for_throughput,
    stack,
    sweep_curve,
    throughput_at_power,
    waveform_levels,
)
from flexmodel.errors import InvalidSweepError


def _shape(compute_w, comm_w, duty, static_share=STATIC_SHARE, exponent=EXPONENT):
    """The shape of one job whose waveform levels are given."""
    levels = (compute_w, comm_w, duty, 200.0, 700.0, static_share, exponent)
    return FamilyShape(*(np.atleast_1d(np.asarray(v, dtype=float)) for v in levels))


def test_waveform_levels_keep_the_mean():
    compute, comm = waveform_levels(600.0, 0.75, 0.5, 700.0)
    assert compute == pytest.approx(600 / (0.75 + 0.25 * 0.5))
    assert 0.75 * compute + 0.25 * comm == pytest.approx(600.0)


def test_a_compute_level_above_the_limit_moves_into_the_comm_phase():
    compute, comm = waveform_levels(660.0, 0.7, 0.45, 700.0)
    assert compute == 700.0
    assert 0.7 * compute + 0.3 * comm == pytest.approx(660.0)
    assert comm <= compute


def test_constant_power_job_follows_the_family_formulas():
    # duty 1: mean power is the clipped level, throughput is y(f) exactly.
    s, a, m = 0.15, 1.6, 0.3
    power, frac = family_point(400.0, _shape(600.0, 600.0, 1.0, s, a), m)
    f = ((400 / 600 - s) / (1 - s)) ** (1 / a)
    assert power == pytest.approx(400.0)
    assert frac == pytest.approx(1 / (m + (1 - m) / f))


def test_a_cap_above_the_compute_level_changes_nothing():
    power, frac = family_point(690.0, _shape(650.0, 300.0, 0.6), 0.2)
    assert power == pytest.approx(0.6 * 650 + 0.4 * 300)
    assert frac == 1.0


@given(
    cap=st.floats(200, 700),
    power=st.floats(250, 700),
    duty=st.floats(0.3, 0.99),
    rho=st.floats(0.1, 1.0),
    m=st.floats(-1.0, 0.9),
)
def test_caps_are_not_mean_power(cap, power, duty, rho, m):
    compute, comm = waveform_levels(power, duty, rho, 700.0)
    mean, frac = family_point(cap, _shape(compute, comm, duty), m)
    assert mean <= min(cap, power) + 1e-9
    assert 0 < frac <= 1.0
    if comm * (1 + 1e-6) < cap < compute * (1 - 1e-6) and duty < 1:
        assert mean < cap  # the clipped compute phase stretches; communication sits lower


def _curves():
    shape = FamilyShape.of(
        power_w=[650.0, 500.0],
        duty=[0.8, 0.6],
        comm_power_fraction=0.5,
        min_cap_w=200.0,
        max_cap_w=700.0,
    )
    return family_curves(shape, [0.0, 0.5], throughput=[1000.0, 4000.0], period_s=[2.0, 1.0])


def test_operating_point_uncapped_and_period_stretch():
    curves = _curves()
    power, thr, period = operating_point(curves, 700.0)
    np.testing.assert_allclose(power, [650.0, 500.0])
    np.testing.assert_allclose(thr, [1000.0, 4000.0])
    np.testing.assert_allclose(period, [2.0, 1.0])
    assert np.all(operating_point(curves, 500.0)[0] < 500.0)  # between comm and compute levels
    power, thr, period = operating_point(curves, 300.0)
    np.testing.assert_allclose(power, 300.0)  # below both levels: clipped throughout
    np.testing.assert_allclose(period, curves.period_s * curves.uncapped_throughput / thr)
    assert np.all(period > curves.period_s)


def test_cap_for_power_inverts_operating_point():
    curves = _curves()
    for cap in (210.0, 333.0, 450.0, 555.0, 640.0):
        power, _, _ = operating_point(curves, cap)
        back = cap_for_power(curves, power)
        again, _, _ = operating_point(curves, back)
        np.testing.assert_allclose(again, power, rtol=1e-12)
    # The uncapped power maps to the highest cap: a job at full power is not capped.
    np.testing.assert_allclose(cap_for_power(curves, curves.uncapped_power_w), [700.0, 700.0])


def test_curves_never_extrapolate():
    curve = sweep_curve([(300, 290.0, 500.0), (700, 600.0, 1000.0)], period_s=1.0)
    power, thr, _ = operating_point(curve, 100.0)
    assert (power[0], thr[0]) == (290.0, 500.0)
    assert throughput_at_power(curve, 10.0)[0] == 500.0


def test_power_for_throughput_takes_the_lowest_power():
    curve = sweep_curve(
        [(200, 200.0, 400.0), (400, 400.0, 1000.0), (700, 600.0, 1000.0)], period_s=1
    )
    assert power_for_throughput(curve, 1000.0)[0] == pytest.approx(400.0)
    assert power_for_throughput(curve, 700.0)[0] == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([(700, 600.0, 1000.0)], "at least two"),
        ([(400, 500.0, 900.0), (700, 450.0, 1000.0)], "power_w falls"),
        ([(400, 400.0, 1100.0), (700, 600.0, 1000.0)], "throughput falls"),
        ([(400, 400.0, 900.0), (400, 410.0, 950.0), (700, 600.0, 1000.0)], "share the cap"),
    ],
)
def test_sweep_curves_refuse_what_cannot_be_interpolated_monotonically(points, message):
    with pytest.raises(InvalidSweepError, match=message):
        sweep_curve(points, period_s=1.0)


def test_stack_pads_short_tables_at_the_low_end():
    short = sweep_curve([(300, 290.0, 500.0), (700, 600.0, 1000.0)], period_s=1.0)
    both = stack([_curves(), short])
    assert both.cap_w.shape == (3, _curves().cap_w.shape[1])
    assert both.power_w[2, 0] == 290.0
    np.testing.assert_allclose(operating_point(both, 500.0)[0][2], operating_point(short, 500.0)[0])
