"""The overhead in force: configured until the meter calibrates it, then the latest fit, kept
across restarts, and used by the job mix the planner and quotes read."""

from __future__ import annotations

import asyncio

import pytest

from gateway.clock import SteppedClock
from gateway.services.jobbook import JobBook
from gateway.services.overhead import Overhead
from gateway.settings import GatewaySettings
from gateway.store.db import Store
from tests.flexmodel.test_calibration import STATIC_KW, K, site
from tests.gateway.conftest import site_jobs


@pytest.fixture
def settings(tmp_path):
    return GatewaySettings(
        lab=True,
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        meter_period_s=1.0,
        calibration_window_s=60.0,
        calibration_settle_s=240.0,
        calibration_history_s=6000.0,
        calibration_every_s=4000.0,
    )


def test_a_calibration_takes_over_from_the_settings_and_survives_a_restart(settings):
    clock = SteppedClock()
    store = Store(settings.database_url)
    overhead = Overhead(settings, store, clock)
    assert overhead.current().source == "configured"
    assert overhead.current().k == settings.overhead_factor
    gpu, facility = site(1)
    for g, f in zip(gpu, facility, strict=True):
        clock.step(1.0)
        overhead.record(float(g), float(f), "modbus://meter")
    model = overhead.current()
    assert model.source == "calibrated"
    assert abs(model.k - K) < 4 * model.k_stderr
    assert abs(model.static_kw - STATIC_KW) < 20.0
    restarted = Overhead(settings, Store(settings.database_url), clock)
    assert restarted.current().k == model.k
    assert restarted.current().source == "calibrated"
    store.close()


def test_a_meter_that_does_not_follow_the_gpus_calibrates_nothing(settings):
    clock = SteppedClock()
    store = Store(settings.database_url)
    overhead = Overhead(settings, store, clock)
    for _ in range(5000):
        clock.step(1.0)
        overhead.record(600.0, 900.0, "modbus://meter")  # no step to learn from
    assert overhead.current().source == "configured"
    assert overhead.last_attempt is not None
    store.close()


def test_the_mix_takes_the_overhead_in_force(settings):
    clock = SteppedClock()
    store = Store(settings.database_url)
    overhead = Overhead(settings, store, clock)
    book = JobBook(store, clock, overhead)
    asyncio.run(book.replace(site_jobs(), "test"))
    assert book.mix().overhead_factor == settings.overhead_factor
    gpu, facility = site(2)
    for g, f in zip(gpu, facility, strict=True):
        clock.step(1.0)
        overhead.record(float(g), float(f), "modbus://meter")
    assert book.mix().overhead_factor == overhead.current().k != settings.overhead_factor
    store.close()
