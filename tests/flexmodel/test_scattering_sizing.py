"""Scattering sized to the coupling (issue 35, case 2): 60 jobs started in phase, the gateway's
evenly spaced rate offsets (`offsets="even"`), a proportional loop at tau = 0.75 T, 600 s.

A 1% spread (the gateway's default) leaves a fleet coupled at 0.05 rad/s locked, 2% leaves one
at 0.1 rad/s, 4% one at 0.2 rad/s; `unlocking_spread` sizes the spread to the coupling and
unlocks each (r1 settles below the Rayleigh threshold at N = 60, about 0.3)."""

from __future__ import annotations

import numpy as np
import pytest

from flexmodel.loops import locked_coupling_per_s, unlocking_spread
from flexmodel.phases import rayleigh_threshold
from flexmodel.syncsim import simulate_sync

JOBS, PERIOD_S = 60, 2.0


def settled_r1(coupling_per_s: float, spread: float, seconds: float = 600.0) -> float:
    run = simulate_sync(
        jobs=JOBS,
        period_s=PERIOD_S,
        duty=0.5,
        delay_s=0.75 * PERIOD_S,
        gain_per_s=coupling_per_s,
        spread=spread,
        duration_s=seconds,
        initial_phases=np.zeros(JOBS),
        offsets="even",
        steps_per_period=50,
    )
    return float(run.order[-50:, 0].mean())


@pytest.mark.parametrize(("coupling_per_s", "too_narrow"), [(0.05, 0.01), (0.1, 0.02), (0.2, 0.04)])
def test_a_spread_sized_to_the_coupling_unlocks_where_a_fixed_one_does_not(
    coupling_per_s, too_narrow
):
    threshold = rayleigh_threshold(JOBS)
    assert settled_r1(coupling_per_s, too_narrow) > 0.8
    sized = unlocking_spread(coupling_per_s, PERIOD_S, delay_s=0.75 * PERIOD_S)
    assert too_narrow < sized < 2.0 * too_narrow  # no wider than it needs
    assert settled_r1(coupling_per_s, sized) < threshold


@pytest.mark.parametrize(("coupling_per_s", "too_narrow"), [(0.05, 0.01), (0.1, 0.02), (0.2, 0.04)])
def test_the_coupling_read_from_a_fleet_locked_under_a_spread_sizes_the_one_that_unlocks_it(
    coupling_per_s, too_narrow
):
    """What the gateway does: the fleet still locked under its spread holds at an r1 that says
    how hard it is pulled; the spread sized to that estimate unlocks it."""
    r1 = settled_r1(coupling_per_s, too_narrow, seconds=300.0)
    estimate = locked_coupling_per_s(r1, too_narrow, PERIOD_S)
    assert estimate == pytest.approx(coupling_per_s, rel=0.15)
    sized = unlocking_spread(estimate, PERIOD_S, delay_s=0.75 * PERIOD_S)
    assert settled_r1(coupling_per_s, sized) < rayleigh_threshold(JOBS)


def test_the_onset_is_pi_k_over_4():
    assert unlocking_spread(0.1, PERIOD_S) == pytest.approx(1.25 * np.pi * 0.1 / 4 / np.pi)
    assert unlocking_spread(0.0, PERIOD_S) == 0.0
    assert locked_coupling_per_s(0.99, 0.0, PERIOD_S) is None  # no spread: no reading
    assert locked_coupling_per_s(0.5, 0.01, PERIOD_S) is None  # not locked: no reading
