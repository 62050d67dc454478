"""The job's own power-to-clock shape from the SM clock at each probed level (`flexmodel.dvfs`)."""

import numpy as np
import pytest

from flexmodel.curves import EXPONENT, STATIC_SHARE, clock_fraction
from flexmodel.dvfs import fit_clock_shape, power_fraction

#: A probe's capped levels: compute-phase power fractions from a shallow to its deepest cap.
LEVELS_Q = np.array([0.9, 0.78, 0.66, 0.5])


@pytest.mark.parametrize(("s", "a"), [(0.08, 1.3), (0.12, 2.0), (0.22, 1.4), (0.2, 1.9)])
def test_exact_levels_give_the_job_s_own_shape(s, a):
    f = clock_fraction(LEVELS_Q, s, a)
    found = fit_clock_shape(LEVELS_Q, f, power_noise=1e-3, clock_noise=1e-3)
    assert found.source == "sm_clock", found.reason
    assert found.static_share == pytest.approx(s, abs=0.01)
    assert found.exponent == pytest.approx(a, abs=0.03)
    assert found.levels == 4


def test_noisy_levels_give_the_curve_far_better_than_the_family_and_honest_errors():
    """200 jobs of the workload model's shapes (static share 0.08-0.22, exponent 1.3-2.0),
    three capped levels read with 0.4% error in power and 0.1% in clock: the fitted curve
    over the probed clocks (0.6 to 1) is within a fifth of the family's distance from the
    truth, and the stated errors cover the parameters at least 90% of the time."""
    rng = np.random.default_rng(34)
    fitted, family, covered = [], [], []
    clocks = np.linspace(0.6, 1.0, 41)
    for _ in range(200):
        s, a = rng.uniform(0.08, 0.22), rng.uniform(1.3, 2.0)
        q = LEVELS_Q[:3]
        f = clock_fraction(q, s, a)
        found = fit_clock_shape(
            q * (1 + rng.normal(0, 0.004, 3)),
            f * (1 + rng.normal(0, 0.001, 3)),
            power_noise=0.004,
            clock_noise=0.001,
        )
        assert found.source == "sm_clock"
        truth = power_fraction(clocks, s, a)
        fitted.append(np.abs(power_fraction(clocks, found.static_share, found.exponent) - truth))
        family.append(np.abs(power_fraction(clocks, STATIC_SHARE, EXPONENT) - truth))
        covered.append(
            abs(found.static_share - s) <= 1.96 * found.static_share_stderr
            and abs(found.exponent - a) <= 1.96 * found.exponent_stderr
        )
    assert np.mean(fitted) < 0.2 * np.mean(family)
    assert np.mean(covered) >= 0.9


def test_no_clock_gives_the_family_s_shape_and_says_why():
    found = fit_clock_shape([0.9, 0.8], [np.nan, np.nan])
    assert (found.source, found.static_share, found.exponent) == ("family", STATIC_SHARE, EXPONENT)
    assert "no SM clock" in (found.reason or "")


def test_one_slowed_level_is_not_enough():
    found = fit_clock_shape([0.95, 0.8], [1.0, clock_fraction(0.8, 0.1, 1.5)[()]])
    assert found.source == "family"
    assert "1 capped level(s) slowed" in (found.reason or "")
    assert found.levels == 1


def test_levels_no_shape_can_draw_run_to_a_bound_and_fall_back():
    # The clock fell further than power: no static share and exponent in range give it.
    found = fit_clock_shape([0.95, 0.9, 0.85], [0.3, 0.2, 0.1])
    assert found.source == "family"
    assert "bound" in (found.reason or "")


def test_mismatched_levels_are_refused():
    with pytest.raises(ValueError, match="2 power fractions against 3 clock fractions"):
        fit_clock_shape([0.9, 0.8], [0.9, 0.8, 0.7])
