"""The frequency trigger's latency counted from the crossing (`/metrics`,
`flexgate_fast_crossing_to_enforced_seconds`), on a stepped clock: an excursion's first
trigger is timed from the reading that crossed, the wait for the re-trigger limit included;
its renewals are not (their crossing is long past); the trigger's own histogram counts every
trigger from when it was sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from agents.protocol_fast import FastFired, FastTrigger
from gateway.clock import SteppedClock
from gateway.services.fast import FastPath
from gateway.services.frequency import FrequencyTrigger
from gateway.settings import GatewaySettings
from gateway.store.db import Store
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN
from tests.gateway.test_fast import SECRET
from tests.promtext import samples


class Broker:
    """A fast transport that takes every trigger (kept, in order)."""

    def __init__(self) -> None:
        self.sent: list[FastTrigger] = []

    async def start(self, on_fired):
        return None

    async def arm_many(self, targets):
        return [None] * len(targets)

    async def trigger(self, body, signature, addresses):
        self.sent.append(FastTrigger.model_validate_json(body))


class Grid:
    """A frequency feed: reads whatever `hz` is."""

    source = "test://grid"

    def __init__(self) -> None:
        self.hz = 50.0

    async def read_hz(self) -> float:
        return self.hz

    async def aclose(self) -> None:
        return None


def test_the_crossing_histogram_counts_each_excursions_first_trigger_from_its_crossing(tmp_path):
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        fast_depths="30",
        fast_secret=SECRET,
        frequency_url="tcp://127.0.0.1:9",
        frequency_threshold_hz=49.7,
        frequency_retrigger_s=1.0,
        frequency_hold_s=2.0,  # renewed 1 s after each trigger while the frequency stays low
    )
    store = Store(settings.database_url)
    clock, broker, grid = SteppedClock(), Broker(), Grid()
    fleet = SimpleNamespace(nodes={"node-01": "node-01"})
    fast = FastPath(settings, store, clock, fleet, None, broker)
    trigger = FrequencyTrigger(settings, clock, fast, grid)
    registry = CollectorRegistry()
    fast.register(registry)

    def report(seq: int) -> FastFired:
        return FastFired(seq=seq, nodes=1, applied=1, failed_gpus=0, elapsed_s=0.01)

    async def run() -> None:
        await trigger.sample()  # 50 Hz at t = 0: nothing
        clock.step(1.0)
        grid.hz = 49.6
        await trigger.sample()  # crosses at t = 1.0 and fires at once
        assert len(broker.sent) == 1
        clock.step(0.08)
        fast.fired(report(broker.sent[0].seq), clock.monotonic())  # enforced 80 ms on
        clock.step(0.12)
        grid.hz = 50.0
        await trigger.sample()  # t = 1.2: released
        clock.step(0.3)
        grid.hz = 49.6
        await trigger.sample()  # t = 1.5: crosses again, held by the 1 s re-trigger limit
        assert len(broker.sent) == 1
        clock.step(0.5)
        await trigger.sample()  # t = 2.0: fires
        assert len(broker.sent) == 2
        clock.step(0.05)
        fast.fired(report(broker.sent[1].seq), clock.monotonic())  # 0.55 s from the crossing
        clock.step(0.95)
        await trigger.sample()  # t = 3.0: still low, renewed: no crossing of its own
        assert len(broker.sent) == 3
        clock.step(0.05)
        fast.fired(report(broker.sent[2].seq), clock.monotonic())
        fast.stop()

    try:
        asyncio.run(run())
    finally:
        store.close()
    figures = samples(generate_latest(registry).decode())
    crossing = "flexgate_fast_crossing_to_enforced_seconds"
    assert figures[f"{crossing}_count"] == 2
    assert abs(figures[f"{crossing}_sum"] - (0.08 + 0.55)) < 1e-9
    assert figures[f'{crossing}_bucket{{le="0.1"}}'] == 1
    assert figures[f'{crossing}_bucket{{le="0.5"}}'] == 1
    assert figures[f'{crossing}_bucket{{le="1.0"}}'] == 2
    sent = "flexgate_fast_trigger_to_enforced_seconds"
    assert figures[f"{sent}_count"] == 3
    assert abs(figures[f"{sent}_sum"] - (0.08 + 0.05 + 0.05)) < 1e-9
