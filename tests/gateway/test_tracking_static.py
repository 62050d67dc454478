"""A setpoint held through a step of the site's static load (a chiller cycling).

On a stepped clock, the mismatched site of `test_tracking` (GPUs drawing 15% less than
declared, overhead factor 1.45 against 1.3 declared), a meter 30 s late, the agents reading
their GPUs' power at 10 Hz.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.gateway.test_tracking import REDUCTION_KW, WARM_UP_S
from tests.gateway.test_tracking_meters import make_site

STEP_AT_S = 600.0
AFTER_S = 600.0


@pytest.mark.parametrize(
    ("share", "past_errors", "back_within_s"),
    [(0.08, [], 35.0), (-0.08, [], 35.0), (0.08, [0.3] * 3, 90.0)],
    ids=["up", "down", "up-past-events"],
)
def test_a_cooling_step_during_a_setpoint_is_fed_forward(
    tmp_path, share, past_errors, back_within_s
):
    """A setpoint 10 kW under the site's draw, held 10 minutes; then the static load steps by
    8% of the site, up or down. The integral alone (its gain 0.2, forced by the meter's 30 s
    of dead time) took it back within 5% of the request after 50 s (up) and 40 s (down). The
    static load read as the meter less the overhead gain times the agents' GPU power, aligned
    for the meter's path, moves the plan by the step once it has held 3 readings, and the
    feed-forward's answer on the GPU power trims it: back within 5% in 25 s and 10 s, without
    swinging past the request by more than 15% of it.

    With three past events that needed 30% of their reduction at the meter (this site's own
    model error), the correction's bound is 60% of what the level asks: the step (3.9 kW,
    5.6 kW of plan at this site's gain) is a measured disturbance, not the model's error, and
    widens the bound by as much (bounded as before, the correction stopped at 6 of the 8.7 kW
    it needs and the site stayed 1.9 kW above the level). Back within 5% in
    65 s: the step is planned at the event's mean shed per planned kW (0.71), where the next
    kW shed more (0.95: the first kW capped what the jobs did not draw), so it passes the
    level by 11% and the integral takes that back."""
    site = make_site(
        tmp_path,
        meter_period_s=5.0,
        time_constant_s=3.0,
        meter_delay_s=30.0,
        noise_kw=0.05,
        read_power=True,
    )
    site.tracker.memory.model_errors.extend(past_errors)
    site.tracker.memory.model_errors_kw.extend(e * REDUCTION_KW for e in past_errors)
    period_s = site.settings.meter_period_s

    async def run() -> list[float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        level_kw = site.meter.true_facility_kw() - REDUCTION_KW
        await site.tracker.pursue("ev-1", REDUCTION_KW, level_kw)
        await site.run_for(STEP_AT_S)
        truth = site.meter.truth
        step_kw = share * site.meter.true_facility_kw()
        site.meter.truth = dataclasses.replace(truth, static_kw=truth.static_kw + step_kw)
        errors = []
        for _ in range(round(AFTER_S / period_s)):
            await site.tick()
            errors.append(site.meter.true_facility_kw() - level_kw)
        return errors

    try:
        errors = asyncio.run(run())
    finally:
        site.close()
    off = [i for i, kw in enumerate(errors) if abs(kw) > 0.05 * REDUCTION_KW]
    back_s = (off[-1] + 1) * period_s
    assert back_s <= back_within_s, back_s
    first = next(i for i, kw in enumerate(errors) if abs(kw) <= 0.05 * REDUCTION_KW)
    assert max(abs(kw) for kw in errors[first:]) < 0.15 * REDUCTION_KW  # no swing past it
