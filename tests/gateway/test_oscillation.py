"""The site's oscillation watched (issue 35, item 4): from the meter and from the agents'
samples, clamped to what each sees; over its limit, the alarm starts scattering.

Sixteen jobs of 2 s in step (`tests.gateway.test_scattering`'s locked fleet) swing the site
as one: each job's two GPUs between compute and communication power, so the fleet's
fundamental is `2 / pi` of its summed swing. The agents sample at 20 Hz (they see up to 10 Hz),
the meter reads every 0.5 s (up to 1 Hz).
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest

from gateway.services.oscillation import OscillationWatch
from gateway.services.site import Sample
from tests.gateway.test_scattering import Site


async def fundamental_kw(site: Site) -> float:
    """The in-step fleet's swing at its period from the agents' raw samples: each GPU's two
    levels (the simulated GPUs clip compute at their 700 W limit), a square wave's fundamental
    (`2 / pi` of its peak to peak) summed over the GPUs."""
    total_w = 0.0
    for answer in (await site.fleet.telemetry()).values():
        for gpu in answer.gpus:
            low_w, high_w = np.percentile(gpu.power_w, [10, 90])
            total_w += high_w - low_w
    return 2.0 / math.pi * total_w / 1000.0


def test_the_agents_see_the_fleets_swing_the_meter_what_its_period_allows(tmp_path):
    site = Site(tmp_path, scatter="off")

    async def go() -> tuple[dict, float]:
        await site.start()
        await site.run_for(12.0)
        return await site.oscillation.check(), await fundamental_kw(site)

    try:
        doc, expected_kw = asyncio.run(go())
    finally:
        site.close()
    assert doc["periods_s"] == [pytest.approx(2.0, rel=0.05)]
    agents, meter = doc["agents"], doc["meter"]
    assert agents["sample_period_s"] == pytest.approx(0.05)
    assert agents["band_observed_hz"][1] == pytest.approx(10.0)  # its Nyquist frequency
    swing_kw = agents["swings"][0]["swing_kw"]
    assert swing_kw == pytest.approx(expected_kw, rel=0.1)
    # A square wave's RMS is its peak over 1, its fundamental's over sqrt(2) (within 0.2-10 Hz
    # the odd harmonics add up to 23% to the fundamental's).
    assert swing_kw / math.sqrt(2) <= agents["rms_kw"] <= 1.3 * swing_kw / math.sqrt(2)
    # The meter, read every 0.5 s, sees up to 1 Hz.
    assert meter["band_observed_hz"][1] == pytest.approx(1.0)
    assert doc["limit_kw"] is None
    assert doc["alarm"] is False


def test_an_oscillation_over_its_limit_starts_scattering_and_shows_in_metrics(tmp_path):
    site = Site(tmp_path, oscillation_limit_kw=1.0)

    async def go() -> tuple[dict, str]:
        await site.start()
        await site.run_for(12.0)  # the reconciliations' checks, before the Rayleigh alarm holds
        return site.oscillation.last, site.scatterer.episode

    try:
        last, episode = asyncio.run(go())
    finally:
        site.close()
    assert last["alarm"] is True
    assert "agents" in last["alarm_sources"]
    assert episode is not None
    assert episode.reason.startswith("oscillation in 0.1-20 Hz above 1 kW RMS")


def test_a_meter_read_every_5_s_sees_nothing_of_the_band_and_says_so():
    history = [Sample(5.0 * i, 0.0, 100.0 + (i % 2), 5.0 * i) for i in range(64)]
    site = SimpleNamespace(feed=object(), history=history)

    async def telemetry() -> dict:
        return {}

    fleet = SimpleNamespace(telemetry=telemetry)
    book = SimpleNamespace(mix=lambda: SimpleNamespace(waving=[]))
    settings = SimpleNamespace(
        oscillation_band_low_hz=0.1,
        oscillation_band_high_hz=20.0,
        oscillation_limit_kw=0.1,
        meter_period_s=5.0,
    )
    doc = asyncio.run(OscillationWatch(settings, site, fleet, book).check())
    assert doc["meter"]["rms_kw"] is None
    assert "nothing of 0.1-20 Hz" in doc["meter"]["reason"]
    assert doc["agents"]["reason"] == "no agent reports"
    assert doc["alarm"] is False  # what no source sees raises nothing


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"oscillation_band_low_hz": 5.0, "oscillation_band_high_hz": 1.0}, "must be above"),
        ({"oscillation_limit_kw": 0.0}, "greater than 0"),
        ({"ramp_down_kw_per_min": -1.0}, "greater than 0"),
    ],
)
def test_bad_oscillation_and_ramp_settings_are_refused(setting, message):
    from gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match=message):
        GatewaySettings(lab=True, **setting)
