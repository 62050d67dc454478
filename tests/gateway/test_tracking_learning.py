"""What the closed site loop carries from one event to the next, on a stepped clock.

The mismatched site of `test_tracking` (GPUs drawing 15% less than declared, overhead factor
1.45 against 1.3 declared), 10 kW asked.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flexgate.lab.simsite import SimulatedSite
from gateway.services.pursuit import Pursuit
from tests.gateway.test_tracking import REDUCTION_KW, WARM_UP_S, mismatched
from tests.gateway.test_tracking_meters import make_site, sheds_for


@pytest.mark.parametrize("basis", ["gain", "meter"])
def test_an_event_whose_meter_faulted_teaches_the_next_ones_nothing(tmp_path, basis):
    """A meter that stops answering for a minute mid-event: what the loop settled on in that
    event is not the model's error, and neither the next events' opening plans (the median of
    past events' errors) nor the correction's bound learn from it. Learnt, a setpoint in the
    campaign benchmark after a dropout opened 41% short of its level (event 13: 50 s to 90%
    of the request on the true power)."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05, loop_delta_basis=basis)

    async def run() -> None:
        await site.start()
        await site.run_for(WARM_UP_S)
        await site.tracker.pursue("ev-1", REDUCTION_KW, None)
        await site.run_for(300.0)
        site.meter.fault = "stop"
        await site.run_for(60.0)
        site.meter.fault = None
        await site.run_for(300.0)
        assert site.tracker.pursuit.settled_share is not None  # it settled on something
        last_gain = site.tracker.memory.last_gain
        site.tracker.release()
        assert not site.tracker.memory.model_errors
        assert site.tracker.memory.last_gain == last_gain

    try:
        asyncio.run(run())
    finally:
        site.close()


def test_a_site_that_draws_nothing_teaches_no_gain_and_raises_nothing(tmp_path):
    """A settled sample of an event on a site at 0 kW (no GPUs drawing, no meter: the
    OpenAPI fuzz test's gateway): the plan achieves 0 kW against a reference of 0 kW. It
    raised ZeroDivisionError in every site sample, logged as "sampling the site failed"."""
    site = make_site(tmp_path)

    async def run() -> None:
        await site.start()
        await site.run_for(WARM_UP_S)
        await site.tracker.pursue("ev-1", REDUCTION_KW, None)
        await site.run_for(30.0)
        assert site.tracker.config.verdict == "safe"  # a gain is learnt only from a safe loop
        pursuit = Pursuit("ev-0", 1.0, None, 0.0, 0.0, 0, measured_kw=0.0)
        site.tracker.memory.learn(pursuit, 0.0, 0.0, short=True, safe=True)
        assert pursuit.gain == 1.0

    try:
        asyncio.run(run())
    finally:
        site.close()


def test_a_level_opens_on_the_gain_the_site_s_deltas_showed(tmp_path):
    """The site's overhead factor is 30% above its declared 1.3 (the campaign's sites are off
    by up to that): every kW the model plans sheds 1.3 kW at the meter. A first delta reads
    that on its first answer; a setpoint after it opened on the model alone (the median of
    past events' errors waits for three of them) and shed 30% past its level until the meter,
    30 s late, answered (the campaign's event 1: 31%). It now opens on the gain the deltas'
    answers showed, and overshoots its level by under 10%."""
    declared, truth = mismatched()
    truth = dataclasses.replace(truth, jobs=declared, overhead_factor=1.3 * 1.3)
    site = SimulatedSite(
        declared,
        truth,
        declared_overhead_factor=1.3,
        folder=tmp_path / "site",
        meter_period_s=5.0,
        meter_delay_s=30.0,
        noise_kw=0.05,
        meter_noise_kw=0.05,
    )

    async def run() -> list[float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        await site.tracker.pursue("ev-1", REDUCTION_KW, None)
        await site.run_for(400.0)
        site.tracker.release()
        await site.targets.hold(0.0, "idle")
        await site.run_for(300.0)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-2", REDUCTION_KW, uncapped - REDUCTION_KW)
        return await sheds_for(site, uncapped, round(120.0 / site.settings.meter_period_s))

    try:
        sheds = asyncio.run(run())
    finally:
        site.close()
    assert site.tracker.memory.site_gain == pytest.approx(1.3, rel=0.05)
    assert max(sheds) < 1.10 * REDUCTION_KW
    assert max(sheds) > 0.9 * REDUCTION_KW  # it opened: not short either
