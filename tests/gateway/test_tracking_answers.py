"""A delta held on the site's gain reads each move's answer at the meter: what lands between.

On a stepped clock, the mismatched site of `test_tracking` (GPUs drawing 15% less than
declared, overhead factor 1.45 against 1.3 declared), 10 kW asked, a meter 10 s late, the
agents reading their GPUs' power at 10 Hz.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.gateway.test_tracking import REDUCTION_KW
from tests.gateway.test_tracking_meters import make_site, true_sheds


@pytest.mark.parametrize("step_kw", [3.0, -3.0])
def test_a_cooling_step_inside_an_answer_is_not_taken_for_the_site_s_shed(tmp_path, step_kw):
    """A chiller steps the static load by 3 kW 20 s into the second event, while the meter is
    still answering its first move: the meter's level after the move carries the step, and
    read on the meter alone the answer was 3 kW off (the site shed about 13 or 7 kW for the
    rest of the event: +-30%). The agents' GPU power does not see the step: its answer times
    the overhead gain the first event's three answers showed is what the move shed, and the
    site holds 10 kW within 5%."""
    site = make_site(
        tmp_path, meter_period_s=5.0, meter_delay_s=10.0, noise_kw=0.05, read_power=True
    )
    truth = site.meter.truth

    async def run() -> list[float]:
        await true_sheds(site, 600.0)
        await site.tracker.pursue("ev-1", 12.0, None)  # a third answer: the gain is believed
        await site.run_for(300.0)
        site.tracker.release()
        await site.targets.hold(0.0, "idle")
        await site.run_for(300.0)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-2", REDUCTION_KW, None)
        sheds = []
        for tick in range(round(600.0 / site.settings.meter_period_s)):
            if tick == 4:
                site.meter.truth = dataclasses.replace(truth, static_kw=truth.static_kw + step_kw)
                uncapped += step_kw
            await site.tick()
            sheds.append(uncapped - site.meter.true_facility_kw())
        return sheds

    try:
        sheds = asyncio.run(run())
    finally:
        site.close()
    settled = sheds[-60:]  # the last five minutes
    assert sum(settled) / len(settled) == pytest.approx(REDUCTION_KW, rel=0.05)
    state = site.tracker.doc()
    assert state["answers_replaced"] >= 1
    assert state["overhead_gain"] == pytest.approx(1.45, rel=0.05)  # the true overhead factor


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_small_move_s_noisy_answer_does_not_set_the_site_s_gain(tmp_path, seed):
    """On a meter of 0.3 kW noise, 8 kW asked, then 9 kW: the second move's answer (about
    1 kW, with 0.5 kW of noise at 2 sigma) is read but is no measure of the site's gain. Each
    small answer was taken as the gain (0.90 to 1.09, 1.15 to 0.68, 1.03 to 0.83 on these
    seeds), and that gain times the plan was what the loop believed the site sheds once the
    16-GPU job ended and the job mix changed under it: 5.85 kW shed for 9 asked (-35%) on
    seed 0, +15% and -9% on the others. The gain now stays the last one read on an answer
    ten times its noise, and the site sheds within 20% of the request after the job's end
    (+17%, +4.7%, +7.7%: after the mix changed, nothing reads the shed whole again)."""
    site = make_site(
        tmp_path,
        meter_period_s=5.0,
        meter_delay_s=10.0,
        noise_kw=0.3,
        meter_noise_kw=0.3,
        seed=seed,
    )
    ended = "llama-3.1-70b-pt-x16"

    async def run() -> float:
        await site.start()
        await site.run_for(60.0)
        uncapped = site.meter.true_facility_kw()
        mine = [(b, g) for b in site.backends for g, gpu in enumerate(b.gpus) if gpu.job]
        mine = [(b, g) for b, g in mine if b.gpus[g].job.id == ended]
        job_kw = sum(b.mean_power_w(g) for b, g in mine) / 1000.0
        await site.tracker.pursue("ev-1", 8.0, None)
        await site.run_for(600.0)
        first_gain = site.tracker.pursuit.gain
        await site.tracker.pursue("ev-1", 9.0, None)
        await site.run_for(600.0)
        assert site.tracker.pursuit.gain == first_gain
        for b, g in mine:
            b.gpus[g].job = None  # the job ends: its GPUs idle
        idle_kw = sum(b.mean_power_w(g) for b, g in mine) / 1000.0
        await site.run_for(15.0)
        await site.book.replace([j for j in site.declared if j["id"] != ended], "scheduler")
        await site.tracker.pursue("ev-1", 9.0, None)
        await site.run_for(600.0)
        without_event = uncapped - site.meter.truth.overhead_factor * (job_kw - idle_kw)
        return without_event - site.meter.true_facility_kw()

    try:
        shed_kw = asyncio.run(run())
    finally:
        site.close()
    assert shed_kw == pytest.approx(9.0, rel=0.20)
