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


class Churn:
    """A limit `share` of the site's draw held on `site`, and the job the campaign churns:
    the true power sampled every meter period while the test holds."""

    def __init__(self, site: RealisticSite, share: float) -> None:
        self.site, self.share = site, share
        self.samples: list[tuple[float, float]] = []

    async def start(self, settle_s: float) -> str:
        """The limit pursued `settle_s` after a window at rest; the job it will churn."""
        site = self.site
        await site.start()
        await site.run_for(300.0)
        self.level_kw = self.share * site.oracle_uncapped_kw()
        await self.pursue()
        await site.run_for(settle_s)
        running = sorted({j for _, _, j in site._gpu_jobs() if j is not None})
        return running[len(running) // 2]

    async def pursue(self) -> None:
        site = self.site
        modelled_kw = site.sim.power.facility_kw(site.book.mix().baseline_gpu_kw)
        reduction_kw = max(modelled_kw - self.level_kw, 0.0)
        await site.tracker.pursue("ev-1", reduction_kw, self.level_kw, ceiling=True)

    async def hold(self, seconds: float) -> None:
        for _ in range(round(seconds / PERIOD_S)):
            await self.site.sim.tick()
            self.samples.append((self.site.clock.monotonic(), self.site.true_facility_kw()))

    async def report(self) -> None:
        """The scheduler's report of the job mix, and the limit's reduction on it."""
        await self.site.report_jobs()
        await self.pursue()


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
    churn = Churn(site, 0.8)

    async def run() -> float:
        job = await churn.start(420.0)
        site.end_job(job)
        await churn.hold(REPORT_S)
        await churn.report()
        await churn.hold(restart_s)
        site.start_job(job)
        changed_s = site.clock.monotonic()
        await churn.hold(REPORT_S)
        await churn.report()
        await churn.hold(240.0)
        return changed_s

    try:
        changed_s = asyncio.run(run())
    finally:
        site.close()
    level_kw, samples = churn.level_kw, churn.samples
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
    churn = Churn(site, 0.55)

    async def run() -> None:
        site.end_job(await churn.start(120.0))
        await churn.hold(REPORT_S)
        await churn.report()
        await churn.hold(900.0)

    try:
        asyncio.run(run())
    finally:
        site.close()
    assert max(minute_means(churn.samples)) <= churn.level_kw
