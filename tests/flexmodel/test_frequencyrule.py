"""The frequency trigger's rule, on hand-worked readings (docs/fast.md, "The frequency
trigger")."""

from __future__ import annotations

import math

import pytest

from flexmodel.errors import FlexModelError
from flexmodel.frequencyrule import (
    Fire,
    FrequencyRule,
    RuleState,
    fault,
    requested_depth,
    step,
)

DEPTHS = (10.0, 20.0, 30.0, 40.0)
#: droop: 50 Hz nominal, dead band to 49.9 Hz, full 40 % at 49.5 Hz: 10 % per 0.1 Hz
DROOP = FrequencyRule("droop", DEPTHS, dead_band_hz=0.1, full_hz=49.5, hold_s=10.0)
THRESHOLD = FrequencyRule(
    "threshold", DEPTHS, nominal_hz=60.0, threshold_hz=59.7, depth_pct=30.0, hold_s=10.0
)


def run(rule, readings):
    """Readings [(t, hz)] through the rule: the triggers fired [(t, depth)], the last state."""
    state, fired = RuleState(), []
    for t, hz in readings:
        state, fire = step(rule, state, t, hz)
        if fire is not None:
            fired.append((t, fire.depth_pct))
    return fired, state


@pytest.mark.parametrize(
    ("hz", "depth"),
    [
        (50.02, 0.0),
        (49.95, 0.0),  # inside the dead band
        (49.85, 0.0),  # 5 % asked: no armed depth at or below
        (49.8, 10.0),  # exactly 10 %
        (49.75, 10.0),  # 15 % snapped down
        (49.61, 20.0),  # 29 %
        (49.6, 30.0),
        (49.5, 40.0),
        (49.0, 40.0),  # beyond full: the deepest
    ],
)
def test_droop_maps_the_fall_below_the_dead_band_to_the_armed_depth_at_or_below(hz, depth):
    assert requested_depth(DROOP, hz) == depth


@pytest.mark.parametrize(("hz", "depth"), [(59.95, 0.0), (59.7, 0.0), (59.69, 30.0), (58, 30.0)])
def test_threshold_fires_its_depth_below_the_set_point(hz, depth):
    assert requested_depth(THRESHOLD, hz) == depth


def test_a_dip_fires_at_the_crossing_and_records_it():
    state, fire = step(THRESHOLD, RuleState(), 0.0, 60.0)
    assert fire is None
    state, fire = step(THRESHOLD, state, 0.1, 59.65)
    assert fire == Fire(depth_pct=30.0, duration_s=10.0, crossing_s=0.1, hz=59.65)
    assert state == RuleState(depth_pct=30.0, crossing_s=0.1, last_trigger_s=0.1)


def test_hysteresis_holds_until_the_frequency_clears_the_set_point_by_its_width():
    # threshold 59.7, hysteresis 0.05: 59.72 is above the set point but within the band
    fired, state = run(THRESHOLD, [(0.0, 59.6), (0.1, 59.72), (0.2, 59.74), (0.3, 59.65)])
    assert fired == [(0.0, 30.0)]  # no second trigger: never released
    assert state.crossing_s == 0.0
    fired, state = run(THRESHOLD, [(0.0, 59.6), (0.1, 59.76)])
    assert state == RuleState(last_trigger_s=0.0)  # released


def test_the_re_trigger_limit_delays_a_new_excursion_to_one_per_period():
    # released at 0.5 s, low again at 1.0 s: the 2 s limit holds it until 2.0 s
    readings = [(0.0, 59.6), (0.5, 59.9), (1.0, 59.6), (1.5, 59.6), (2.0, 59.6)]
    fired, state = run(THRESHOLD, readings)
    assert fired == [(0.0, 30.0), (2.0, 30.0)]
    assert state.crossing_s == 1.0  # counted from the crossing, not the delayed trigger


def test_a_deeper_droop_fires_within_the_limit_and_a_long_excursion_is_renewed():
    readings = [(0.0, 49.75), (1.0, 49.5), (2.0, 49.5), (9.9, 49.5), (10.0, 49.5), (11.0, 49.5)]
    fired, _ = run(DROOP, readings)
    # 10 % at once; 40 % asked at 1 s waits for the 2 s limit; renewed when 2 s of hold is left
    assert fired == [(0.0, 10.0), (2.0, 40.0), (10.0, 40.0)]


def test_within_the_hysteresis_the_droop_holds_its_depth_when_renewing():
    # 49.82 asks for nothing (8 %) but lies within 0.05 Hz of asking 10 %: held at 20 %
    readings = [(0.0, 49.7), (8.0, 49.82), (8.1, 49.86)]
    fired, state = run(DROOP, readings)
    assert fired == [(0.0, 20.0), (8.0, 20.0)]
    assert state.crossing_s is None  # 49.86 - 0.05 asks for nothing: released


@pytest.mark.parametrize("bad", [None, 44.0, 66.0, math.nan, 0.0])
def test_a_fault_never_fires_nor_renews_and_changes_nothing(bad):
    assert fault(THRESHOLD, bad) is not None
    held = RuleState(depth_pct=30.0, crossing_s=0.0, last_trigger_s=0.0)
    for state in (RuleState(), held):
        for t in (0.1, 9.0, 20.0):
            assert step(THRESHOLD, state, t, bad) == (state, None)
    assert fault(THRESHOLD, 59.9) is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"full_hz": 59.99}, "full depth"),
        ({"depth_pct": 25.0}, "armed one"),
        ({"threshold_hz": 60.1}, "below nominal"),
        ({"hold_s": 2.0}, "re-trigger"),
        ({"hysteresis_hz": -0.1}, "hysteresis"),
    ],
)
def test_rules_that_cannot_work_are_refused_naming_the_problem(changes, words):
    base = {
        "mode": "threshold",
        "depths_pct": DEPTHS,
        "nominal_hz": 60.0,
        "threshold_hz": 59.7,
        "depth_pct": 30.0,
        "full_hz": 59.5,
    }
    with pytest.raises(FlexModelError, match=words):
        FrequencyRule(**(base | changes))
