"""The site loop's gain rule against a simulated loop whose meter is not what it believes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.looprobust import SiteLoop, parameter_error, robust_gain, worst_loop_gain


def simulate(
    gain: float,
    *,
    period_s: float,
    dead_s: float,
    tau_s: float,
    true_dead_s: float,
    true_tau_s: float,
    true_gain: float,
    steps: int = 400,
) -> np.ndarray:
    """A unit request through a Smith-predicted integrator, sampled every `period_s`: the
    loop's model of the meter is (dead_s, tau_s, gain 1), the true one (true_dead_s,
    true_tau_s, true_gain). What the site truly sheds, per unit asked, at each sample (the
    plant before the meter, as the campaign scores it)."""
    dt = period_s / 20.0  # the plant runs finer than the loop samples
    n_fine = steps * 20
    planned = np.zeros(n_fine)  # the requested reduction, held between samples
    model = np.zeros(n_fine)  # the model's meter response to it
    meter = np.zeros(n_fine)
    shed = np.zeros(n_fine)
    correction = 0.0
    lag = np.zeros(2)  # first-order states: model, truth
    for i in range(n_fine):
        if i % 20 == 0 and i:
            # The Smith predictor: the meter plus what the model has not shown yet of the plan.
            unseen = planned[i - 1] - model[i - 1]
            correction += gain * (1.0 - (meter[i - 1] + unseen))
        planned[i] = max(1.0 + correction, 0.0) if i % 20 == 0 else planned[i - 1]
        shed[i] = true_gain * planned[i]
        for j, (dead, tau, scale) in enumerate(
            ((dead_s, tau_s, 1.0), (true_dead_s, true_tau_s, true_gain))
        ):
            source = scale * planned[i - round(dead / dt)] if i * dt >= dead else 0.0
            lag[j] += (1 - math.exp(-dt / tau)) * (source - lag[j]) if tau > 0 else source - lag[j]
        model[i], meter[i] = lag
    return shed[::20]  # per unit asked, sampled as the loop does


@pytest.mark.parametrize(
    ("dead_s", "true_dead_s", "tau_s", "true_tau_s", "true_gain"),
    [
        (30.0, 40.0, 3.0, 3.0, 1.0),
        (30.0, 20.0, 3.0, 6.0, 1.25),
        (10.0, 15.0, 10.0, 5.0, 0.8),
        (0.0, 2.5, 3.0, 6.0, 1.3),
    ],
)
def test_the_gain_chosen_keeps_a_mismatched_loop_from_ringing(
    dead_s, true_dead_s, tau_s, true_tau_s, true_gain
):
    """The rule's gain, for a path known to +-25% (+ half a period) and a 30% gain error, on
    a loop whose true meter is off by about that much: the true shed settles at the request
    without ringing (what it undershoots after its peak is small), and it overshoots no more
    than the configured gain of 0.5 on the same loop, clearly less where the rule lowered it.
    A dead time the model misses by 10 s still costs an overshoot while the loop waits for a
    response that comes late (29% at 30 s believed, 40 s true; 69% at the configured gain):
    the rule keeps the loop stable, identification keeps it accurate."""
    period_s = 5.0
    loop = SiteLoop(
        period_s,
        10.0,
        tau_s,
        parameter_error(dead_s, None, period_s),
        parameter_error(tau_s, None, period_s),
        0.3,
    )
    gain = robust_gain(0.5, loop)
    truth = {"true_dead_s": true_dead_s, "true_tau_s": true_tau_s, "true_gain": true_gain}
    path = {"period_s": period_s, "dead_s": dead_s, "tau_s": tau_s}
    robust, fixed = simulate(gain, **path, **truth), simulate(0.5, **path, **truth)
    assert robust[-20:] == pytest.approx(np.ones(20), abs=0.01)  # it settles at the request
    peak = int(np.argmax(robust))
    assert min(robust[peak:]) > 0.85  # no ringing after its peak
    assert max(robust) <= max(fixed) + 1e-9
    step = max(1.0, true_gain)  # the open-loop plan's own error, before the loop acts
    if gain < 0.3 and max(fixed) > step + 0.1:  # lowered well below 0.5, where 0.5 overshoots
        assert max(robust) - step < 0.6 * (max(fixed) - step)


@settings(max_examples=60, deadline=None)
@given(
    period_s=st.floats(0.5, 10.0),
    window_s=st.floats(1.0, 60.0),
    tau_s=st.floats(0.0, 60.0),
    dead_error_s=st.floats(0.0, 30.0),
    tau_error_s=st.floats(0.0, 20.0),
    gain_error=st.floats(0.0, 0.9),
    most=st.floats(0.05, 1.5),
)
def test_the_gain_is_at_most_the_configured_one_meets_its_margin_and_falls_with_the_error(
    period_s, window_s, tau_s, dead_error_s, tau_error_s, gain_error, most
):
    loop = SiteLoop(period_s, window_s, tau_s, dead_error_s, tau_error_s, gain_error)
    gain = robust_gain(most, loop)
    assert 0.0 <= gain <= most
    assert gain == most or worst_loop_gain(gain, loop) <= 0.5 + 1e-9
    wider = SiteLoop(period_s, window_s, tau_s, 2 * dead_error_s + 1.0, tau_error_s, gain_error)
    assert robust_gain(most, wider) <= gain + 1e-6
