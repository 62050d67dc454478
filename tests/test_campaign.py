"""The campaign benchmark's first 20 events (bench/campaign_bench.py) on the loop of this tree.

The same draws as the 200-event run (a seeded campaign: its first 20 events are these). The
bounds are the ones today's loop meets with margin; the issue's targets that it does not yet
meet are asserted apart, as expected failures (strict: meeting them fails the test, so the
bounds get raised).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import campaign_bench

pytestmark = pytest.mark.slow


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


@pytest.mark.xfail(strict=True, reason="issue 31 items 3, 4 and 6: not met by today's loop")
def test_the_issues_targets(runs):
    free = [r for r in runs if not r["fault"]]
    assert sum(r["within"] for r in free if r["kind"] != "limit") >= 0.99 * len(free)
    assert all(r["intervals_above"] == 0 for r in fault_free(runs, "limit"))
    assert all(r["overshoot"] < 0.10 for r in free)
