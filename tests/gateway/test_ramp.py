"""The ramp-rate limit (issue 35, item 4): every plan moves the site's power at most the
limit per minute, each way, the event's shed and its rebound alike, and each event says how
its plans ramped.

On the stepped clock, the mismatched site of `test_tracking` (its true response per planned
kW is not the model's), 10 kW asked through the site loop, then released.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.services.ramp import RampLimit, RampReport
from tests.gateway.test_tracking import REDUCTION_KW, WARM_UP_S
from tests.gateway.test_tracking_meters import make_site

DOWN, UP = 4.0, 5.0  #: kW per minute
PERIOD_S = 5.0


def test_a_bound_moves_a_steps_worth_at_once_and_the_limit_per_minute_after():
    ramp = RampLimit(DOWN, UP, step_s=PERIOD_S)
    assert ramp.bound(10.0, 0.0) == pytest.approx(DOWN * PERIOD_S / 60)  # from nothing held
    assert ramp.limited
    ramp.held_kw = 10.0
    # After an hour at 10 kW, 20 kW asked: a step's worth now (a hold earns no ramp).
    assert ramp.bound(20.0, 3600.0) == pytest.approx(10.0 + DOWN * PERIOD_S / 60)
    assert ramp.limited
    assert ramp.bound(20.0, 3602.0) == pytest.approx(10.0 + DOWN * 7.0 / 60)
    # Released: the up limit, from what is held.
    held = ramp.held_kw
    assert ramp.bound(0.0, 3607.0) == pytest.approx(held - UP * PERIOD_S / 60)
    assert ramp.minimum_release_s(10.0) == pytest.approx(120.0)
    free = RampLimit(None, None, step_s=PERIOD_S)
    free.bound(0.0, 0.0)
    assert free.bound(50.0, 1.0) == 50.0
    assert not free.active


def test_an_events_report_keeps_the_steepest_minute_each_way():
    report = RampReport(DOWN, UP)
    for at_s, kw in [(0, 0.0), (30, 2.0), (59, 3.5), (90, 5.0), (200, 1.0), (230, 0.0)]:
        report.note(float(at_s), kw, limited=kw < 5.0)
    assert report.steepest_down_kw_per_min == pytest.approx(3.5)  # 0 to 3.5 within a minute
    assert report.steepest_up_kw_per_min == pytest.approx(1.0)  # 200 s is over a minute after 90
    assert report.plans == 6
    assert report.doc()["limited_plans"] == 5


async def sheds(site, seconds: float) -> list[float]:
    out = []
    for _ in range(round(seconds / PERIOD_S)):
        await site.tick()
        out.append(site.uncapped_kw - site.meter.true_facility_kw())
    return out


def steepest(values: list[float], rising: bool) -> float:
    """The largest change over any minute of values a period apart."""
    span = round(60.0 / PERIOD_S)
    sign = 1.0 if rising else -1.0
    return max(
        sign * (values[j] - values[i])
        for i in range(len(values))
        for j in range(i + 1, min(i + span + 1, len(values)))
    )


def run_event(tmp_path, **settings) -> tuple[list[float], list[float], dict | None]:
    site = make_site(tmp_path, meter_period_s=PERIOD_S, time_constant_s=3.0, **settings)

    async def go() -> tuple[list[float], list[float]]:
        await site.start()
        await site.run_for(WARM_UP_S)
        site.uncapped_kw = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-1", REDUCTION_KW, None)
        shed = [0.0, *await sheds(site, 400.0)]  # from the site before the event
        site.tracker.release()
        site.targets.release()
        rebound = [shed[-1], *await sheds(site, 300.0)]
        return shed, rebound

    try:
        shed, rebound = asyncio.run(go())
    finally:
        site.close()
    report = site.targets.ramp.reports.get("ev-1")
    return shed, rebound, report.doc() if report else None


def test_the_shed_and_the_rebound_keep_to_the_ramp_limits(tmp_path):
    shed, rebound, report = run_event(
        tmp_path / "limited", ramp_down_kw_per_min=DOWN, ramp_up_kw_per_min=UP
    )
    # The true power falls at most the limit per minute (plus the model's gain error on it),
    # and still reaches the target once the ramp has had its time.
    assert steepest(shed, rising=True) <= 1.15 * DOWN
    assert shed[-1] == pytest.approx(REDUCTION_KW, rel=0.05)
    # The rebound is spread over the up limit's pace, to the caps' release.
    assert steepest(rebound, rising=False) <= 1.15 * UP
    assert abs(rebound[-1]) < 0.05 * REDUCTION_KW
    assert report["limited_plans"] > 0
    assert report["steepest_down_kw_per_min"] <= DOWN + 1e-6
    assert report["steepest_up_kw_per_min"] <= UP + 1e-6
    assert report["steepest_up_kw_per_min"] > 0.8 * UP  # the rebound used its allowance
    # Without a limit the same site sheds the whole request within a minute, and rebounds so.
    free_shed, free_rebound, none = run_event(tmp_path / "free")
    assert steepest(free_shed, rising=True) > 2 * DOWN
    assert steepest(free_rebound, rising=False) > 1.5 * UP
    assert none is None
