"""The lab meter against real simulated agents on loopback: it reads their true GPU power,
lags it like cooling, and serves it the way the gateway's HTTP JSON meter reads it."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import httpx
import numpy as np
import pytest

from flexgate.lab.meter import LabMeter, create_app, parse_fault
from flexgate.serve import ServerThread, free_port
from flexmodel.calibration import OverheadCalibration, fit_overhead
from gateway.clock import SteppedClock
from gateway.errors import MeterError
from gateway.meter import open_meter
from tests.gateway.conftest import AGENT_TOKEN, start_site

STATIC_KW, K = 40.0, 1.25
CAP_W = 200.0  # the simulated GPUs' lowest limit
INTEGRATION_S = 6.5  # longer than the longest uncapped iteration of the site's jobs [s]


@pytest.fixture
def agents(tmp_path):
    """Six simulated 8-GPU nodes running two of the example site's jobs: their base URLs."""
    _, nodes, app = start_site(tmp_path, database_url=None)
    with ServerThread(app) as url:
        yield [f"{url}/nodes/{name}" for name in nodes]


def cap_everything(urls: list[str], cap_w: float | None = CAP_W, generation: int = 1) -> float:
    """Cap every GPU at `cap_w` (None: back to the originals); the limits enforced [kW]."""
    command = {"plan_id": f"lab-{generation}", "generation": generation, "lease_s": 60}
    command["caps"] = [] if cap_w is None else [{"gpu": g, "cap_w": cap_w} for g in range(8)]
    enforced_w = 0.0
    for url in urls:
        answer = httpx.put(
            f"{url}/v1/caps", json=command, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}
        )
        assert answer.status_code == 200, answer.text
        enforced_w += sum(r["enforced_w"] for r in answer.json()["results"])
    return enforced_w / 1000


async def poll_until(meter: LabMeter, session, check, what: str) -> None:
    for _ in range(500):
        await meter.poll(session)
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_meter_follows_the_agents_true_power_through_a_first_order_lag(agents):
    clock = SteppedClock()
    meter = LabMeter(
        agents,
        static_kw=STATIC_KW,
        overhead_factor=K,
        time_constant_s=10.0,
        integration_s=0.2,
        clock=clock,
    )

    async def scenario():
        async with aiohttp.ClientSession() as session:
            await poll_until(meter, session, lambda: meter.gpu_power_kw, "every agent")
            uncapped_kw = meter.gpu_power_kw
            steady_kw = meter.true_facility_kw()
            capped_limit_kw = await asyncio.to_thread(cap_everything, agents)
            # polls at one instant of the meter's clock: the GPUs drop, the load has not moved
            await poll_until(
                meter, session, lambda: meter.gpu_power_kw < capped_limit_kw, "the caps to bite"
            )
            held_kw = meter.true_facility_kw()
            clock.step(10.0)  # one time constant
            await meter.poll(session)
            return uncapped_kw, steady_kw, held_kw, meter.gpu_power_kw, meter.true_facility_kw()

    uncapped_kw, steady_kw, held_kw, capped_kw, lagged_kw = asyncio.run(scenario())
    assert uncapped_kw > 1.5 * CAP_W * 8 * len(agents) / 1000  # the jobs draw well over the caps
    assert steady_kw == pytest.approx(STATIC_KW + K * uncapped_kw)
    assert held_kw == steady_kw
    target_kw = STATIC_KW + K * capped_kw
    assert lagged_kw == pytest.approx(held_kw + (1 - math.exp(-1)) * (target_kw - held_kw))


def test_the_meter_shows_a_step_only_after_its_dead_time_and_its_faults_as_asked(agents):
    """A 20 s transport delay: a cap shows in no reading until 20 s after it; a freeze holds
    the reading (2 kW off it) whatever the GPUs do, with the answers still fresh; a dropout
    answers nothing."""
    clock = SteppedClock()
    meter = LabMeter(
        agents, static_kw=STATIC_KW, overhead_factor=K, integration_s=0.2, clock=clock, dead_s=20.0
    )

    async def scenario() -> list[float | None]:
        async with aiohttp.ClientSession() as session:
            await poll_until(meter, session, lambda: meter.gpu_power_kw, "every agent")
            before = meter.reading_kw()
            capped_limit_kw = await asyncio.to_thread(cap_everything, agents)
            # Every GPU under its cap (a loaded machine's first poll after the caps can still
            # average some uncapped samples: the reading 20 s on would show only part of them).
            await poll_until(
                meter, session, lambda: meter.gpu_power_kw < capped_limit_kw, "the caps to bite"
            )
            seen = [before, meter.reading_kw()]  # the cap is in the load, not in the reading
            clock.step(19.0)
            await meter.poll(session)
            seen.append(meter.reading_kw())
            clock.step(1.0)
            await meter.poll(session)
            seen.append(meter.reading_kw())  # 20 s on: the reading shows it
            meter.fault_after(parse_fault("meter-freeze:2@5"))
            clock.step(5.0)
            frozen = meter.reading_kw()
            await asyncio.to_thread(cap_everything, agents, None, 2)  # the caps go
            clock.step(60.0)
            await poll_until(meter, session, lambda: meter.true_facility_kw() > before - 1, "up")
            seen += [frozen, meter.reading_kw()]
            meter.fault_after(parse_fault("meter-dropout@0"))
            seen.append(meter.reading_kw())
            return seen

    before, same, still, shown, frozen, held, dropped = asyncio.run(scenario())
    assert same == before
    assert still == before
    assert shown < before - 1.0
    assert frozen == pytest.approx(shown + 2.0)
    assert held == frozen
    assert dropped is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("meter-freeze", "expected one of"),
        ("meter-melt@3", "expected one of"),
        ("meter-dropout:2@3", "expected one of"),
        ("meter-offset:x@3", "must be numbers"),
        ("meter-freeze@-1", "not negative"),
    ],
)
def test_a_lab_meter_fault_that_cannot_be_read_is_refused_naming_it(text, expected):
    with pytest.raises(ValueError, match=expected):
        parse_fault(text)


@pytest.mark.slow
def test_the_calibration_recovers_the_lab_sites_true_overhead_factor(agents):
    """Cap steps on real simulated agents, the lab meter sampled every (stepped) second: the
    fit finds the factor and static load the lab meter was given; a level regression does not."""
    clock = SteppedClock()
    # Each GPU reading is a mean over an iteration of the longest job (6.2 s), as the fit asks:
    # the jobs' swing then moves a reading little from one poll to the next, however slowly
    # the polls come, and only the cap steps stand out.
    meter = LabMeter(
        agents,
        static_kw=STATIC_KW,
        overhead_factor=K,
        noise_kw=0.3,
        time_constant_s=5.0,
        integration_s=INTEGRATION_S,
        clock=clock,
        seed=3,
    )
    caps_w = [None, 300, 550, 250, 450, 200, 600, 350, 650, None]

    async def sample() -> tuple[np.ndarray, np.ndarray]:
        gpu_kw, facility_kw = [], []
        async with aiohttp.ClientSession() as session:
            for generation, cap_w in enumerate(caps_w, start=1):
                await asyncio.to_thread(cap_everything, agents, cap_w, generation)
                # the agents' readings over a whole integration are at the new caps
                await asyncio.sleep(INTEGRATION_S + 0.5)
                for _ in range(60):
                    clock.step(1.0)
                    await meter.poll(session)
                    gpu_kw.append(meter.gpu_power_kw)
                    facility_kw.append(meter.reading_kw())
        return np.array(gpu_kw), np.array(facility_kw)

    gpu_kw, facility_kw = asyncio.run(sample())
    fit = fit_overhead(gpu_kw, facility_kw, period_s=1.0, window_s=10.0, settle_s=40.0)
    assert isinstance(fit, OverheadCalibration), fit
    # Of the nine steps at least six stand out from what is left of the jobs' swing: the halves
    # of a job on several nodes swing together (one job, one phase), as they do on a real site.
    assert fit.points >= 6
    assert abs(fit.k - K) < 5 * fit.k_stderr
    assert abs(fit.static_kw - STATIC_KW) < 5 * fit.static_stderr_kw
    # A level regression is biased low by the meter's lag (about 0.1 here): clearly below the
    # factor, by its own error or 0.05, whichever is less (the jobs' swing widens that error).
    assert np.polyfit(gpu_kw, facility_kw, 1)[0] < K - min(10 * fit.k_stderr, 0.05)


def test_the_gateway_reads_the_lab_meter_over_http(agents):
    meter = LabMeter(agents, static_kw=STATIC_KW, overhead_factor=K, noise_kw=0.5, period_s=0.05)

    async def read(url: str) -> list[float]:
        gateway_meter = open_meter(f"{url}/meter")
        assert gateway_meter is not None
        try:
            for _ in range(500):  # until every agent has answered once
                try:
                    await gateway_meter.read_kw()
                    break
                except MeterError:
                    await asyncio.sleep(0.02)
            return [await gateway_meter.read_kw() for _ in range(20)]
        finally:
            await gateway_meter.aclose()

    with ServerThread(create_app(meter)) as url:
        readings_kw = asyncio.run(read(url))
        truth = httpx.get(f"{url}/meter").json()
    assert len(set(readings_kw)) > 1  # noise on every reading
    expected_kw = STATIC_KW + K * truth["gpu_power_kw"]
    # the jobs' power moves between reads, so the readings scatter around the truth
    assert sum(readings_kw) / len(readings_kw) == pytest.approx(expected_kw, rel=0.05)


def test_a_lab_meter_whose_agents_never_answer_is_a_503_the_gateway_flags():
    meter = LabMeter([f"http://127.0.0.1:{free_port()}"], static_kw=1, overhead_factor=1.1)

    async def read(url: str) -> None:
        gateway_meter = open_meter(f"{url}/meter")
        try:
            with pytest.raises(MeterError, match="answered HTTP 503"):
                await gateway_meter.read_kw()
        finally:
            await gateway_meter.aclose()

    with ServerThread(create_app(meter)) as url:
        asyncio.run(read(url))
        assert httpx.get(f"{url}/meter").json() == {"detail": "not every agent has answered yet"}
    assert meter.errors >= 1


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"agent_urls": []}, "at least one agent URL"),
        ({"static_kw": -1.0}, "static_kw must be finite"),
        ({"noise_kw": math.nan}, "noise_kw must be finite"),
        ({"overhead_factor": 0.9}, "must be >= 1"),
        ({"time_constant_s": -1.0}, "time_constant_s >= 0"),
        ({"period_s": 0.0}, "period_s > 0"),
    ],
)
def test_impossible_lab_meter_parameters_are_refused(options, expected):
    given = {"agent_urls": ["http://127.0.0.1:1"], "static_kw": 1.0, "overhead_factor": 1.2}
    with pytest.raises(ValueError, match=expected):
        LabMeter(**{**given, **options})
