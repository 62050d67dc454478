"""The site loop on a meter whose readings come in steps larger than its noise (a revenue
meter's register in 0.5 kW steps), on the campaign's site model (`flexgate.lab.realsite`),
not the loop's own: at a steady level such a meter reads one value for as long as the truth
stays inside a step, which is no freeze; a freeze of it is still caught, by the moves of the
loop it does not answer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import numpy as np

from flexgate.lab.realsite import Cooling, MeterPath, RealisticSite, draw_site

PERIOD_S = 5.0
STEP_KW = 0.5
DEPTH = 0.07  #: the request's share of the site's power: about 2 kW, four steps


def coarse_site(tmp_path) -> RealisticSite:
    draw = draw_site(np.random.default_rng(7), max_nodes=4)
    draw = dataclasses.replace(
        draw,
        cooling=Cooling(base_kw=draw.cooling.base_kw),  # no chiller steps: the level is steady
        path=MeterPath(
            dead_s=30.0, lag_s=10.0, averaging_s=30.0, noise_kw=0.05, quantum_kw=STEP_KW
        ),
    )
    return RealisticSite(draw, seed=7, meter_period_s=PERIOD_S, folder=tmp_path / "site")


async def hold_level(site: RealisticSite, seconds: float) -> tuple[float, float, list]:
    """The level asked, the request, and after each meter period (true kW, the feed's fault)."""
    await site.start()
    await site.run_for(300.0)
    uncapped_kw = site.oracle_uncapped_kw()
    request_kw = DEPTH * uncapped_kw
    level_kw = uncapped_kw - request_kw
    await site.tracker.pursue("ev-coarse", request_kw, level_kw)
    samples = []
    for _ in range(round(seconds / PERIOD_S)):
        await site.sim.tick()
        samples.append((site.true_facility_kw(), site.sim.feed.state().get("fault")))
    return level_kw, request_kw, samples


def test_a_coarse_meter_holding_one_step_at_a_steady_level_is_believed(tmp_path, caplog):
    """An hour at a setpoint: the meter reads the same step for minutes on end (as it did while
    the loop ramped, it wandered before), and is never taken for stuck; a reading's move of
    one step (the truth crossing a step's edge) is not taken for a static load's step of a
    whole one and fed forward (it was, once in this hour); the level is held within 5% of the
    request on the true power, about a tenth of a step."""
    caplog.set_level(logging.INFO, logger="flexgate")
    site = coarse_site(tmp_path)
    try:
        level_kw, request_kw, samples = asyncio.run(hold_level(site, 3600.0))
    finally:
        site.close()
    faults = [fault for _, fault in samples if fault]
    assert not faults, faults[0]
    assert not [r.message for r in caplog.records if "static load stepped" in r.message]
    readings = [r.power_kw for r in site.sim.feed.recent(3600.0)]
    assert len(set(readings)) <= 4  # the meter did read in steps, and held them
    settled = [kw for kw, _ in samples[len(samples) // 3 :]]
    assert abs(np.mean(settled) - level_kw) < 0.05 * request_kw


def test_a_coarse_meter_frozen_above_the_truth_is_caught_by_the_moves_it_does_not_answer(
    tmp_path,
):
    """Its hold is no evidence, but the loop answers a reading a step above the level by
    moving the caps, and the frozen register does not follow: caught within a few settling
    times, and the loop holds on the estimate."""
    site = coarse_site(tmp_path)

    async def run() -> list:
        await hold_level(site, 1200.0)
        site.meter.freeze(1.5)
        after = []
        for _ in range(round(900.0 / PERIOD_S)):
            await site.sim.tick()
            after.append(site.sim.feed.state().get("fault"))
        return after

    try:
        faults = asyncio.run(run())
    finally:
        site.close()
    caught = next((i for i, fault in enumerate(faults) if fault), None)
    assert caught is not None, "the frozen register was believed for 15 minutes"
    assert caught * PERIOD_S <= 600.0
    assert faults[caught].startswith(("stuck: ", "no_response: "))
