"""An import limit held while a job ends and starts again under it (issue 31).

On a stepped clock, `flexgate.lab.realsite`'s site (the campaign benchmark's) of four nodes: the
overhead factor 20% above the declared 1.3, a meter 30 s late through a 3 s lag unless a
test says otherwise, no cooling cycle; the scheduler reports each change of the job mix 60 s
late.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from flexgate.lab.jobs import lab_jobs
from flexgate.lab.realsite import Cooling, MeterPath, RealisticSite, SiteDraw
from flexgate.lab.simsite import draw_truth

PERIOD_S = 5.0
REPORT_S = 60.0
INTERVAL_S = 60.0


def make_site(tmp_path, path: MeterPath | None = None) -> RealisticSite:
    declared = lab_jobs(4, 8, seed=3)
    truth = draw_truth(declared, overhead_factor=1.3, static_kw=0.0, rng=np.random.default_rng(3))
    gpu_kw = sum(j["power_w"] * j["gpus"] for j in declared) / 1000.0
    draw = SiteDraw(
        declared,
        truth.jobs,
        overhead_factor=1.3 * 1.2,
        cooling=Cooling(base_kw=0.2 * 1.3 * gpu_kw),
        path=path or MeterPath(dead_s=30.0, lag_s=3.0, noise_kw=0.02),
    )
    return RealisticSite(draw, seed=3, meter_period_s=PERIOD_S, folder=tmp_path / "site")


def minute_means(samples: list[tuple[float, float]]) -> list[float]:
    """The true power's mean over each whole minute of `samples` (time, kW), from the first."""
    t = np.array([s[0] for s in samples])
    kw = np.array([s[1] for s in samples])
    return [
        float(np.mean(kw[(t >= start) & (t < start + INTERVAL_S)]))
        for start in np.arange(t[0], t[-1] - INTERVAL_S + 1e-9, INTERVAL_S)
    ]


@pytest.mark.parametrize("restart_s", [120.0, 10.0])
def test_a_job_that_starts_under_a_limit_is_answered_before_the_meter_shows_it(tmp_path, restart_s):
    """An import limit 20% under the site's draw; then the job the campaign churns (a
    quarter of the site) ends, is reported a minute later, and starts again after two
    minutes, uncapped (its GPUs were released with it). The loop answered what the meter
    showed, 30 s after the GPUs, or the scheduler's report a minute late: the site stayed 25%
    above the limit for 50 s after the restart (the campaign's event 35: +10.4% the minute
    after a restart). The agents' GPU power, every job's GPUs counted whether the scheduler
    has reported the job or not, shows the step within seconds and it is fed forward: the
    site is back within 3% of the limit in under 30 s, before the meter shows anything, and
    every minute after the first ends under the limit (the report then takes over what the
    feed-forward took: no second excursion).

    Restarted 10 s after the report of its end, the loop is still re-planning each period
    towards the level the end left room for, so no stretch of every GPU's power is free of
    its own moves: the GPUs no placed job holds, which no plan moves, show the step then."""
    site = make_site(tmp_path)

    async def run() -> tuple[float, float, list[tuple[float, float]]]:
        await site.start()
        await site.run_for(300.0)
        level_kw = 0.8 * site.oracle_uncapped_kw()
        await site.tracker.pursue("ev-1", reduction_kw(level_kw), level_kw, ceiling=True)
        await site.run_for(420.0)
        running = sorted({j for _, _, j in site._gpu_jobs() if j is not None})
        job = running[len(running) // 2]
        samples: list[tuple[float, float]] = []

        async def hold(seconds: float) -> None:
            for _ in range(round(seconds / PERIOD_S)):
                await site.sim.tick()
                samples.append((site.clock.monotonic(), site.true_facility_kw()))

        async def report() -> None:
            await site.report_jobs()
            await site.tracker.pursue("ev-1", reduction_kw(level_kw), level_kw, ceiling=True)

        site.end_job(job)
        await hold(REPORT_S)
        await report()
        await hold(restart_s)
        site.start_job(job)
        changed_s = site.clock.monotonic()
        await hold(REPORT_S)
        await report()
        await hold(240.0)
        return level_kw, changed_s, samples

    def reduction_kw(level_kw: float) -> float:
        return max(site.sim.power.facility_kw(site.book.mix().baseline_gpu_kw) - level_kw, 0.0)

    try:
        level_kw, changed_s, samples = asyncio.run(run())
    finally:
        site.close()
    after = [(t - changed_s, kw) for t, kw in samples if t > changed_s]
    above = [t for t, kw in after if kw > 1.03 * level_kw]
    assert not above or max(above) < 30.0, above
    later = [(t, kw) for t, kw in samples if t > changed_s + INTERVAL_S]
    assert max(minute_means(later)) <= level_kw


def test_a_job_that_ends_while_the_loop_settles_is_given_back_once(tmp_path):
    """An import limit 45% under the site's draw, on a meter 50 s late through a 27 s lag (the
    campaign's site 17); two minutes in, while the loop is still re-planning towards the limit
    each period, the churned job ends, and the scheduler reports it a minute later. Its GPUs'
    drop was not fed forward (no stretch of their power was free of the loop's own moves), so
    the report's move of the model's baseline was expected at the meter from the report on,
    while the meter had been showing the drop since: the loop gave the job's room back twice
    and the site averaged 3.7% above the limit over a minute. The move is now expected from
    when the agents' GPU power showed it: no minute after the end is above the limit."""
    site = make_site(tmp_path, MeterPath(dead_s=50.0, lag_s=27.0, noise_kw=0.02))

    async def run() -> tuple[float, float, list[tuple[float, float]]]:
        await site.start()
        await site.run_for(300.0)
        level_kw = 0.55 * site.oracle_uncapped_kw()
        await site.tracker.pursue("ev-1", reduction_kw(level_kw), level_kw, ceiling=True)
        await site.run_for(120.0)
        running = sorted({j for _, _, j in site._gpu_jobs() if j is not None})
        samples: list[tuple[float, float]] = []

        async def hold(seconds: float) -> None:
            for _ in range(round(seconds / PERIOD_S)):
                await site.sim.tick()
                samples.append((site.clock.monotonic(), site.true_facility_kw()))

        site.end_job(running[len(running) // 2])
        ended_s = site.clock.monotonic()
        await hold(REPORT_S)
        await site.report_jobs()
        await site.tracker.pursue("ev-1", reduction_kw(level_kw), level_kw, ceiling=True)
        await hold(900.0)
        return level_kw, ended_s, samples

    def reduction_kw(level_kw: float) -> float:
        return max(site.sim.power.facility_kw(site.book.mix().baseline_gpu_kw) - level_kw, 0.0)

    try:
        level_kw, ended_s, samples = asyncio.run(run())
    finally:
        site.close()
    assert samples[0][0] > ended_s
    assert max(minute_means(samples)) <= level_kw
