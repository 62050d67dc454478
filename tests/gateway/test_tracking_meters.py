"""The closed site loop against meters as they really are (issue: hold the target on a real site).

The simulated site's meter differs from the loop's belief in the ways real ones do: seconds to
a minute of pure transport delay before a first-order lag (a BMS or SCADA hop, a revenue
meter's register), and a register that freezes while its timestamps stay fresh. On a stepped
clock, the mismatched site of `test_tracking` (GPUs drawing 15% less than declared, overhead
factor 1.45 against 1.3 declared, 20 kW of static load nobody declared), 10 kW asked.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json

import pytest

from flexgate.lab.simsite import SimulatedSite, Truth
from gateway.services.delivery import delivery_doc
from gateway.store import repo
from tests.gateway.conftest import EXAMPLES, site_jobs
from tests.gateway.test_tracking import REDUCTION_KW, WARM_UP_S, mismatched


def make_site(tmp_path, **options) -> SimulatedSite:
    declared, truth = mismatched()
    return SimulatedSite(
        declared, truth, declared_overhead_factor=1.3, folder=tmp_path / "site", **options
    )


def delivered(site: SimulatedSite, event_id: str) -> dict:
    """The event's delivery record, as the API shows it."""
    with site.store.session() as s:
        return delivery_doc(repo.deliveries(s, event_ids=[event_id])[event_id])


async def sheds_for(site: SimulatedSite, uncapped_kw: float, ticks: int) -> list[float]:
    """The site's true shed against `uncapped_kw` after each of the next `ticks` samples."""
    sheds = []
    for _ in range(ticks):
        await site.tick()
        sheds.append(uncapped_kw - site.meter.true_facility_kw())
    return sheds


async def true_sheds(site: SimulatedSite, seconds: float) -> tuple[float, list[float]]:
    """The site's true shed (uncapped less its true facility power, before the meter) at
    every meter period of an event of `seconds`."""
    await site.start()
    await site.run_for(WARM_UP_S)
    uncapped = site.meter.true_facility_kw()
    await site.tracker.pursue("ev-1", REDUCTION_KW, None)
    return uncapped, await sheds_for(site, uncapped, round(seconds / site.settings.meter_period_s))


@pytest.mark.parametrize("basis", ["gain", "meter"])
@pytest.mark.parametrize("dead_s", [20.0, 30.0, 40.0])
def test_a_meter_with_tens_of_seconds_of_dead_time_settles_without_ringing(tmp_path, dead_s, basis):
    """The defaults (a sample every 5 s, a 10 s window, gain 0.5) on a meter whose own delay
    is 20-40 s before a 3 s lag. The loop predicts the dead time as dead time (not as lag)
    and lowers its gain to what a dead time known to +-25% allows: it overshoots by under
    10%, and once it has reached 90% of the request it stays within 10% of it (the loop that
    took the delay for lag swung from 110% down to 67% at 30 s). Held on the site's gain, each
    move waits for its whole answer: no ringing either."""
    site = make_site(
        tmp_path,
        loop_delta_basis=basis,
        meter_period_s=5.0,
        loop_window_s=10.0,
        time_constant_s=3.0,
        meter_delay_s=dead_s,
        noise_kw=0.02,
    )
    try:
        _, sheds = asyncio.run(true_sheds(site, 600.0))
    finally:
        site.close()
    assert max(sheds) < 1.10 * REDUCTION_KW
    reached = next(i for i, kw in enumerate(sheds) if kw >= 0.9 * REDUCTION_KW)
    assert reached * site.settings.meter_period_s < 240.0
    assert min(sheds[reached:]) > 0.9 * REDUCTION_KW, sheds
    settled = sheds[-24:]  # the last two minutes
    assert max(abs(kw - REDUCTION_KW) for kw in settled) < 0.03 * REDUCTION_KW
    rule = site.tracker.doc()["gain_rule"]
    assert rule.startswith("gain ")
    assert f"dead time {dead_s:.1f} +/- " in rule


@pytest.mark.parametrize("basis", ["gain", "meter"])
@pytest.mark.parametrize("offset_kw", [3.0, -3.0])
def test_a_frozen_meter_is_caught_and_the_loop_undoes_what_it_believed(tmp_path, offset_kw, basis):
    """A meter whose value freezes 3 kW above (or below) the truth while its timestamps stay
    fresh. The loop's next moves go unanswered: the watch calls it stuck within a few
    settling times, the loop goes back to its correction from before the freeze and holds,
    the site's figures fall back to the estimate, and the site keeps shedding what was asked
    (believed, the meter drove it to its bound: 15.7 kW, or to nothing). When the meter reads
    again the suspicion lifts and the loop goes on."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05, loop_delta_basis=basis)

    async def run() -> None:
        uncapped, _ = await true_sheds(site, 120.0)
        before = site.tracker.doc()["correction_kw"]
        site.meter.freeze(offset_kw)
        faults, sheds = [], []
        for _ in range(300):
            await site.tick()
            faults.append((await site.power.doc())["meter"]["fault"])
            sheds.append(uncapped - site.meter.true_facility_kw())
        caught = next(i for i, fault in enumerate(faults) if fault)
        assert caught * site.settings.meter_period_s <= 20.0
        assert faults[caught].startswith("stuck: ")
        assert all(faults[caught:])  # not believed again while it stays frozen
        assert site.tracker.doc()["correction_kw"] == pytest.approx(before, abs=0.1)
        # Until it is caught the loop answers the frozen error (its moves, expected at the gain
        # the site has shown, go unanswered): a transient, undone once caught.
        assert max(abs(kw - REDUCTION_KW) for kw in sheds) < 0.25 * REDUCTION_KW
        assert max(abs(kw - REDUCTION_KW) for kw in sheds[caught + 10 :]) < 0.02 * REDUCTION_KW
        health = (await site.power.doc())["meter"]
        assert health["fault"] == site.power.meter_fault  # what /health and /metrics read
        assert site.feed.suspected["stuck"] == 1
        site.meter.fault = None
        await site.run_for(120.0)
        assert (await site.power.doc())["meter"]["fault"] is None
        assert site.tracker.doc()["error_kw"] == pytest.approx(0.0, abs=0.03 * REDUCTION_KW)
        assert uncapped - site.meter.true_facility_kw() == pytest.approx(REDUCTION_KW, rel=0.02)

    try:
        asyncio.run(run())
    finally:
        site.close()


@pytest.mark.parametrize("basis", ["gain", "meter"])
def test_a_delta_is_not_shed_again_for_a_cooling_step(tmp_path, basis):
    """A chiller adds 3 kW of static load ten minutes into a 10 kW delta, on a meter 10 s
    late. What the site would draw without the event rises by the same 3 kW, so the event's
    shed is unchanged: held on the site's gain (each of the plan's moves read on its own
    answer), the site keeps shedding 10 kW. Held at the meter, the loop takes the step for
    the model's error and sheds it too (the campaign's deltas that missed, 14 of 18)."""
    site = make_site(
        tmp_path, meter_period_s=5.0, meter_delay_s=10.0, noise_kw=0.05, loop_delta_basis=basis
    )
    truth = site.meter.truth

    async def run() -> list[float]:
        uncapped, _ = await true_sheds(site, 600.0)
        step_kw = 3.0
        site.meter.truth = dataclasses.replace(truth, static_kw=truth.static_kw + step_kw)
        sheds = []
        for _ in range(round(600.0 / site.settings.meter_period_s)):
            await site.tick()
            sheds.append(uncapped + step_kw - site.meter.true_facility_kw())
        return sheds

    try:
        sheds = asyncio.run(run())
    finally:
        site.close()
    settled = sheds[-24:]  # the last two minutes
    if basis == "gain":
        assert max(abs(kw - REDUCTION_KW) for kw in sheds) < 0.03 * REDUCTION_KW
        assert site.tracker.doc()["basis"] == "gain"
    else:
        assert min(settled) > REDUCTION_KW + 2.5  # the step shed as well


def test_a_frozen_meter_is_caught_on_a_steady_hold(tmp_path):
    """A delta held on the site's gain makes no move for hours once its shed is read, so no
    predicted move can go unanswered: a register that holds one value exactly, where the
    meter's noise made every reading differ, is stuck all the same, within a few settling
    times."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05)

    async def run() -> None:
        await true_sheds(site, 600.0)
        plans = site.tracker.pursuit.planned_kw
        site.meter.freeze(2.0)
        faults = []
        for _ in range(120):
            await site.tick()
            faults.append((await site.power.doc())["meter"]["fault"])
        assert site.tracker.pursuit.planned_kw == plans  # no move made, none predicted
        caught = next(i for i, fault in enumerate(faults) if fault)
        assert caught * site.settings.meter_period_s <= 30.0
        assert faults[caught].startswith("stuck: ")
        assert "where they wandered before" in faults[caught]

    try:
        asyncio.run(run())
    finally:
        site.close()


def test_a_meter_back_from_a_dropout_holding_one_value_is_caught(tmp_path):
    """A BMS point that drops out and comes back holding one value (its last, or a default)
    on a steady hold: the readings since it came back show nothing of the meter's noise to
    compare with, but the meter's past does, however long ago. Forgetting it with the
    readings of the interval judged (as the watch did), the register was believed for the
    rest of the event."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05)

    async def run() -> None:
        await true_sheds(site, 600.0)
        site.meter.fault = "stop"
        await site.run_for(600.0)
        site.meter.freeze(1.0)
        faults = []
        for _ in range(60):
            await site.tick()
            faults.append((await site.power.doc())["meter"]["fault"])
        assert faults[0] is None  # it reads again, fresh, and is believed at first
        caught = next(i for i, fault in enumerate(faults) if fault)
        assert caught * site.settings.meter_period_s <= 60.0
        assert faults[caught].startswith("stuck: ")
        assert "where they wandered before" in faults[caught]
        assert all(faults[caught:])

    try:
        asyncio.run(run())
    finally:
        site.close()


def test_a_meter_found_stuck_is_believed_again_before_the_next_event(tmp_path):
    """An event ends with its meter suspected stuck; between events the register moves again.
    The next event reads the site's level before it from the meter, not from the model (which
    left a setpoint 65% over its step in the campaign), because the suspicion was lifted as
    soon as the readings moved, with no event's prediction to compare them with."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05)

    async def run() -> None:
        await true_sheds(site, 300.0)
        site.meter.freeze(2.0)
        await site.run_for(120.0)
        assert (await site.power.doc())["meter"]["fault"].startswith("stuck: ")
        site.tracker.release()
        await site.targets.hold(0.0, "idle")
        site.meter.fault = None
        await site.run_for(60.0)
        assert (await site.power.doc())["meter"]["fault"] is None
        read_kw = site.power.filtered_kw(site.tracker.config.window_s)  # the meter's, believed
        assert read_kw is not None
        await site.tracker.pursue("ev-2", REDUCTION_KW, None)
        assert site.tracker.pursuit.start_facility_kw == read_kw

    try:
        asyncio.run(run())
    finally:
        site.close()


@pytest.mark.parametrize("reduction_kw", [1.5, 2.0])
def test_a_small_delta_whose_first_caps_sit_above_the_jobs_true_draw_is_met(tmp_path, reduction_kw):
    """On the mismatched site the GPUs draw 15% less than declared: the first caps of a small
    delta sit above what the jobs truly draw and shed next to nothing. The meter says so, and
    its watch believes it (it wanders as before); the loop moves on until the meter shows the
    delta. Taking the model's word for it where the answer strayed below the gain believed,
    the loop held 1.5 kW asked at 0.04 kW shed (-97%) and 2 kW at -71% for the whole event."""
    site = make_site(tmp_path, noise_kw=0.05, meter_noise_kw=0.05)

    async def run() -> None:
        await site.start()
        await site.run_for(WARM_UP_S)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-1", reduction_kw, None)
        sheds = []
        for _ in range(240):
            await site.tick()
            sheds.append(uncapped - site.meter.true_facility_kw())
        settled = sheds[-120:]
        assert sum(settled) / len(settled) == pytest.approx(reduction_kw, rel=0.05)
        assert (await site.power.doc())["meter"]["fault"] is None

    try:
        asyncio.run(run())
    finally:
        site.close()


@pytest.mark.parametrize("ceiling", [False, True])
def test_an_import_limit_is_a_ceiling_met_in_every_averaging_interval(tmp_path, ceiling):
    """An import capacity limit 10 kW under the site's draw, on a meter with 0.3 kW of noise:
    planned as a setpoint the site sits on the limit, and a utility averaging each minute
    finds it above in many of them (the reference VTN's 11 kW limit was held at 11.2 kW);
    planned as a ceiling it sits below by the loop's margin (2% of the limit before it has
    errors of its own, then their 95th percentile), and no minute after the ramp allowance
    averages above. The event's record says so."""
    site = make_site(tmp_path, noise_kw=0.3, meter_noise_kw=0.3)

    async def run() -> dict:
        await site.start()
        await site.run_for(WARM_UP_S)
        limit_kw = site.meter.true_facility_kw() - REDUCTION_KW
        await site.tracker.pursue("ev-1", REDUCTION_KW, limit_kw, ceiling=ceiling)
        await site.run_for(1200.0)
        return delivered(site, "ev-1")

    try:
        doc = asyncio.run(run())
    finally:
        site.close()
    if not ceiling:
        assert doc["limit"] is None  # a setpoint is not judged as a limit
        return
    limit = doc["limit"]
    assert limit["intervals"] >= 15
    assert limit["above"] == 0
    assert limit["met"] is True
    assert limit["worst_kw"] < limit["limit_kw"]
    assert limit["worst_kw"] > limit["limit_kw"] - 0.05 * REDUCTION_KW  # not far below: a margin
    assert site.tracker.doc()["limit_margin_kw"] > 0


def test_a_setpoint_held_at_an_import_limit_exceeds_it_in_about_half_the_minutes(tmp_path):
    """The same limit planned as a setpoint (what the 3.1 VEN did): the minutes' means
    scatter around it, so a utility finds many above."""
    site = make_site(tmp_path, noise_kw=0.3, meter_noise_kw=0.3)

    async def run() -> list[float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        limit_kw = site.meter.true_facility_kw() - REDUCTION_KW
        await site.tracker.pursue("ev-1", REDUCTION_KW, limit_kw)
        await site.run_for(60.0)  # the ramp allowance
        trace = await site.run_for(1200.0)
        minutes = [trace[i : i + 60] for i in range(0, len(trace), 60)]
        return [sum(kw for _, kw in m) / len(m) - limit_kw for m in minutes]

    try:
        excess = asyncio.run(run())
    finally:
        site.close()
    assert sum(e > 0 for e in excess) >= 3, excess


@pytest.mark.parametrize("period_s", [1.0, 5.0])
def test_on_the_estimate_the_loop_takes_no_phantom_correction(tmp_path, period_s):
    """No meter: two jobs of 2 s and 3 s periods, exactly as declared, 3.75 kW asked. Each
    reading of the estimate is the agents' mean over their last samples as of their last
    telemetry round; the loop predicts every reading in its window at that time, so it takes
    nothing of the step's timing for model error (predicting a continuous average instead,
    its correction reached -0.61 kW and the site shed 16% too little for 20 s)."""
    declared = json.loads((EXAMPLES / "compose-site.json").read_text())["jobs"]
    for job, period in zip(declared, (2.0, 3.0), strict=True):
        job["period_s"] = period
    site = SimulatedSite(
        declared,
        Truth(copy.deepcopy(declared), overhead_factor=1.3, static_kw=0.0),
        declared_overhead_factor=1.3,
        metered=False,
        sample_hz=10.0,
        meter_period_s=period_s,
        folder=tmp_path / "site",
    )
    reduction_kw = 3.75

    async def run() -> tuple[list[float], list[float]]:
        await site.start()
        await site.run_for(WARM_UP_S)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-1", reduction_kw, None)
        corrections, sheds = [], []
        for _ in range(round(60.0 / period_s)):
            await site.run_for(period_s)
            corrections.append(site.tracker.doc()["correction_kw"])
            sheds.append(uncapped - site.meter.true_facility_kw())
        return corrections, sheds

    try:
        corrections, sheds = asyncio.run(run())
    finally:
        site.close()
    assert max(abs(c) for c in corrections) < 0.04 * reduction_kw, corrections
    assert all(abs(kw - reduction_kw) < 0.03 * reduction_kw for kw in sheds), sheds


def test_the_correction_s_bound_follows_the_model_error_past_events_needed(tmp_path):
    """Before any event the correction may take the configured share of the reduction (100%);
    after three events that each needed about a third of their reduction at the meter, no
    more than twice that: a meter gone wrong can no longer drive the site to its floor."""
    site = make_site(tmp_path)

    async def run() -> list[float | None]:
        await site.start()
        await site.run_for(WARM_UP_S)
        bounds = []
        for n in range(4):
            await site.tracker.pursue(f"ev-{n}", REDUCTION_KW, None)
            bounds.append(site.tracker.doc()["correction_bound_kw"])
            await site.run_for(120.0)
            site.tracker.release()
            site.targets.release()  # the caps step back, as when an event ends
            await site.run_for(120.0)
        return bounds

    try:
        bounds = asyncio.run(run())
    finally:
        site.close()
    assert bounds[:3] == [REDUCTION_KW] * 3
    errors = list(site.tracker.memory.model_errors)
    assert len(errors) == 4
    assert all(0.2 < e < 0.5 for e in errors), errors  # the mismatched site: about a third
    assert bounds[3] == pytest.approx(2 * max(errors[:3]) * REDUCTION_KW)
    assert bounds[3] < 0.99 * REDUCTION_KW


@pytest.mark.parametrize("past_errors", [[], [0.05, 0.05, 0.05]])
def test_a_level_is_reached_where_the_model_puts_the_site_below_it(tmp_path, past_errors):
    """GPUs drawing 15% more than declared, through a larger overhead factor and a static load
    nobody declared: the model's baseline is under the level asked for, so by the model the
    event asks for nothing. The correction is bounded by what the meter says is asked (the
    reference less the level), not by the model's reduction, and the site reaches the level
    (bounded by the model's, the correction stopped at 1 kW and the meter stayed far above).
    With three past events that needed 5% at the meter the bound is 25% of what is asked,
    around what the meter asks: bounded around 0 instead, the correction stopped at a quarter
    of the way (the campaign's setpoints that never reached their level)."""
    declared, truth = mismatched()
    truth = Truth(
        [
            {**job, "power_w": min(round(job["power_w"] / 0.85 * 1.15, 1), 686.0)}
            for job in truth.jobs
        ],
        overhead_factor=1.45,
        static_kw=20.0,
    )
    site = SimulatedSite(declared, truth, declared_overhead_factor=1.3, folder=tmp_path / "s")
    site.tracker.memory.model_errors.extend(past_errors)  # the loop's memory of past events

    async def run() -> tuple[float, float, float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        level_kw = site.meter.true_facility_kw() - REDUCTION_KW
        model_kw = site.power.facility_kw(site.book.mix().baseline_gpu_kw)
        reduction_kw = max(model_kw - level_kw, 0.0)
        await site.tracker.pursue("ev-1", reduction_kw, level_kw)
        await site.run_for(300.0)
        return level_kw, model_kw, site.meter.true_facility_kw()

    try:
        level_kw, model_kw, reached_kw = asyncio.run(run())
    finally:
        site.close()
    assert model_kw < level_kw  # by the model there is nothing to shed
    assert reached_kw == pytest.approx(level_kw, abs=0.03 * REDUCTION_KW)


def test_a_small_level_is_reached_where_past_events_needed_a_small_share_of_more(tmp_path):
    """Three past events of 12 kW each needed 12% more than the model planned at the meter
    (1.44 kW). A level 2 kW under the mismatched site's draw needs 67% more (3.35 kW planned:
    the first caps sit above what its GPUs truly draw and shed nothing): a model's error is part
    offset, so the correction's bound is twice the largest past error in kW where that is more
    than twice its largest share (bounded by the share, 0.5 kW, the correction stopped at 2.5 kW
    and the site stayed 0.9 kW above the level, as the campaign's 2.6 kW setpoint on a site
    whose deeper events needed 26% stayed 9% short)."""
    site = make_site(tmp_path)
    site.tracker.memory.model_errors.extend([0.12] * 3)
    site.tracker.memory.model_errors_kw.extend([0.12 * 12.0] * 3)
    asked_kw = 2.0

    async def run() -> tuple[float, float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        level_kw = site.meter.true_facility_kw() - asked_kw
        model_kw = site.power.facility_kw(site.book.mix().baseline_gpu_kw)
        await site.tracker.pursue("ev-1", max(model_kw - level_kw, 0.0), level_kw)
        await site.run_for(300.0)
        return level_kw, site.meter.true_facility_kw()

    try:
        level_kw, reached_kw = asyncio.run(run())
    finally:
        site.close()
    assert reached_kw == pytest.approx(level_kw, abs=0.05 * asked_kw)
    assert site.tracker.doc()["correction_bound_kw"] == pytest.approx(asked_kw)  # 100%: the most


def test_a_job_that_ends_mid_event_moves_the_target_by_its_draw_less_its_gpus_idle(tmp_path):
    """The 32-GPU job ends mid-event on a site exactly as declared: its GPUs idle at once (80 W
    each), the scheduler tells the gateway 15 s later. The site without the event now draws
    the job's power less its GPUs' idle draw less; the loop's reference falls by as much
    (`FLEXGATE_GPU_IDLE_W`), so the remaining job sheds what was asked (the reference fell by
    the job's whole power, so the loop asked the remaining job for the idle draw's 3.3 kW at
    the meter too, more than it can give)."""
    declared = site_jobs()
    site = SimulatedSite(
        declared,
        Truth(copy.deepcopy(declared), overhead_factor=1.3, static_kw=0.0),
        declared_overhead_factor=1.3,
        folder=tmp_path / "site",
    )
    ended = "qwen3-32b-pt-x32"

    async def run() -> tuple[float, float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        uncapped = site.meter.true_facility_kw()
        gpus = [(b, g) for b in site.backends for g, gpu in enumerate(b.gpus) if gpu.job]
        mine = [(b, g) for b, g in gpus if b.gpus[g].job.id == ended]
        job_kw = sum(b.mean_power_w(g) for b, g in mine) / 1000.0
        await site.tracker.pursue("ev-1", REDUCTION_KW / 2, None)
        await site.run_for(120.0)
        for b, g in mine:
            b.gpus[g].job = None  # the job ends: its GPUs idle
        idle_kw = sum(b.mean_power_w(g) for b, g in mine) / 1000.0
        await site.run_for(15.0)
        await site.book.replace([j for j in site.declared if j["id"] != ended], "scheduler")
        await site.tracker.pursue("ev-1", REDUCTION_KW / 2, None)
        await site.run_for(240.0)
        without_event = uncapped - site.truth.overhead_factor * (job_kw - idle_kw)
        return without_event - site.meter.true_facility_kw(), idle_kw

    try:
        shed_kw, idle_kw = asyncio.run(run())
    finally:
        site.close()
    assert idle_kw == pytest.approx(32 * 0.080)
    assert shed_kw == pytest.approx(REDUCTION_KW / 2, rel=0.05)


def test_a_new_reduction_carries_the_model_error_as_a_gain_not_as_kw(tmp_path):
    """19 kW asked (more than the mismatched site can shed: every job at its floor), then
    4 kW: the correction learned at the deep cut is carried as a share of the reduction, so
    the shallow one does not start 40% deep (kept as kW, it shed 5.7 kW for 30 s)."""
    site = make_site(tmp_path)

    async def run() -> list[float]:
        await site.start()
        await site.run_for(WARM_UP_S)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev-1", 19.0, None)
        await site.run_for(120.0)
        await site.tracker.pursue("ev-1", 4.0, None)
        return await sheds_for(site, uncapped, 60)

    try:
        sheds = asyncio.run(run())
    finally:
        site.close()
    assert max(sheds[5:]) < 4.0 * 1.15, sheds  # after the caps have moved
    assert sheds[-1] == pytest.approx(4.0, rel=0.05)


def test_a_ceiling_s_margin_covers_a_chiller_cycling_under_it(tmp_path):
    """A chiller cycles 4.5 kW of static load (9% of the limit) on and off every minute under
    import limits 10 kW below the site's draw, on a meter 10 s late. The loop's settled error
    at the meter spreads by the step, and its 95th percentile is past 5% of the limit: the
    margin may take it (up to 10%), and the second limit has no minute above it (held at 5%,
    9 of its 18 minutes were above)."""
    site = make_site(tmp_path, meter_period_s=5.0, meter_delay_s=10.0, noise_kw=0.05)
    truth = site.meter.truth

    async def run() -> dict:
        await site.start()
        await site.run_for(WARM_UP_S)
        limit_kw = site.meter.true_facility_kw() - REDUCTION_KW
        for n in range(2):
            await site.tracker.pursue(f"ev-{n}", REDUCTION_KW, limit_kw, ceiling=True)
            for cycle in range(20):
                step_kw = 4.5 if cycle % 2 else 0.0
                site.meter.truth = dataclasses.replace(truth, static_kw=truth.static_kw + step_kw)
                await site.run_for(60.0)
            site.tracker.release()
            site.targets.release()
            site.meter.truth = truth
            await site.run_for(300.0)
        return delivered(site, "ev-1")

    try:
        doc = asyncio.run(run())
    finally:
        site.close()
    assert doc["limit"]["intervals"] >= 15
    assert doc["limit"]["above"] == 0, doc["limit"]
