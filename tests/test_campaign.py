"""The campaign benchmark's first 20 events (bench/campaign_bench.py) on the loop of this tree.

The same draws as the 200-event run (a seeded campaign: its first 20 events are these). The
bounds are the ones the loop meets with margin; where it falls short of the issue's targets
(docs/benchmarks.md, "Campaign") is reported there, not asserted.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import campaign_bench

# Twenty events on the stepped clock: about two minutes of one core alone, more beside the
# suite's other workers; the default 300 s would fail the fixture under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def runs():
    return campaign_bench.campaign(20)


def fault_free(runs, kind):
    return [r for r in runs if r["kind"] == kind and not r["fault"]]


def test_the_campaign_draws_every_target_type_and_faults_in_a_fifth(runs):
    assert len(runs) == 20
    assert {r["kind"] for r in runs} == {"delta", "setpoint", "limit"}
    assert sum(r["fault"] is not None for r in runs) >= 4
    assert all(900.0 <= r["duration_s"] <= 36000.0 for r in runs)


def test_deltas_reach_90_percent_on_the_true_power_within_30_s_and_land_near_the_request(runs):
    deltas = fault_free(runs, "delta")
    assert len(deltas) >= 5
    assert all(r["t90_true_s"] is not None and r["t90_true_s"] <= 30.0 for r in deltas)
    errors = [abs(r["settled_error"]) for r in deltas]
    assert statistics.median(errors) < 0.15, errors


def test_a_meter_dropout_is_a_fault_within_30_s(runs):
    dropouts = [r for r in runs if r["fault"] == "dropout"]
    assert dropouts
    assert all(
        r["fault_detected_s"] is not None and r["fault_detected_s"] <= 30.0 for r in dropouts
    )


def test_levels_and_limits_open_from_the_meter_and_limits_hold_their_intervals(runs):
    """A level's open-loop plan starts from the meter before the event less the level: 90% of
    the request on the true power within 30 s (from the model's baseline it took 45-80 s);
    limits are ceilings: fewer than 5% of their averaging intervals above."""
    levels = fault_free(runs, "setpoint") + fault_free(runs, "limit")
    assert all(r["t90_true_s"] is not None and r["t90_true_s"] <= 30.0 for r in levels)
    limits = fault_free(runs, "limit")
    above = sum(r["intervals_above"] for r in limits)
    assert above < 0.05 * sum(r["intervals"] for r in limits)


def test_a_frozen_meter_is_caught(runs):
    frozen = [r for r in runs if r["fault"] == "freeze"]
    assert frozen
    assert all(r["fault_detected_s"] is not None for r in frozen)
