"""A renewal is not a new event (docs/fast.md, "One event, renewed"): a trigger while a fast
event lasts renews it at the depth in force, or starts a stretch at another depth (recorded
when), and the event ends with its last trigger. On the stepped clock, a real store, and a
transport that takes every trigger."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace

import pytest

from gateway.clock import SteppedClock
from gateway.services.fast import FastPath
from gateway.services.settlement import Settlement
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN
from tests.gateway.test_settlement import EVENT_DAY, settings_for, write_day
from tests.gateway.test_settlement_meter import EVERY_SECOND, MINUTE_KW, START, write_samples

SECRET = "fast-secret-0123456789abcdef"
#: each depth's planned reduction at the meter [kW]
EXPECTED_KW = {10.0: 12.0, 20.0: 25.0, 30.0: 37.5, 40.0: 50.0}


class Taken:
    """A fast transport whose broker takes every trigger; what it was given."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def start(self, on_fired):
        return None

    async def arm_many(self, targets):
        return [None] * len(targets)

    async def trigger(self, body, signature, addresses):
        self.bodies.append(body)


@pytest.fixture
def fast(tmp_path):
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        fast_depths="10,20,30,40",
        fast_secret=SECRET,
    )
    store = Store(settings.database_url)
    clock = SteppedClock()
    fleet = SimpleNamespace(nodes={"node-01": "mem://node-01"})
    path = FastPath(settings, store, clock, fleet, None, Taken())
    path.expected_kw = dict(EXPECTED_KW)
    yield path
    path.stop()
    store.close()


def stored(fast: FastPath) -> list:
    with fast.store.session() as s:
        return [e for e in repo.list_events(s) if e.source == "fast"]


def test_renewals_and_a_deeper_trigger_extend_and_deepen_one_event(fast):
    clock: SteppedClock = fast.clock

    async def go() -> None:
        start = clock.now()
        first = await fast.trigger(20.0, 30.0, cause="the frequency feed read 49.65 Hz")
        assert first["renewal"] is False
        clock.step(25.0)
        renewed = await fast.trigger(20.0, 30.0)  # the frequency rule's renewal
        assert renewed["renewal"] is True
        assert renewed["event_id"] == first["event_id"]
        clock.step(10.0)
        deeper = await fast.trigger(40.0, 30.0)
        assert deeper["event_id"] == first["event_id"]
        clock.step(20.0)
        shallower = await fast.trigger(10.0, 30.0)  # the frequency recovering, still low
        assert shallower["event_id"] == first["event_id"]
        [event] = stored(fast)
        assert event.status == "triggered"
        assert event.reduction_kw == EXPECTED_KW[40.0]  # its deepest
        assert event.end.replace(tzinfo=start.tzinfo) == start + timedelta(seconds=85.0)
        stretches = [
            (i["depth_pct"], i["start"], i["end"], len(i["triggers"])) for i in event.intervals
        ]
        at = [(start + timedelta(seconds=s)).isoformat() for s in (0, 35, 55, 85)]
        assert stretches == [
            (20.0, at[0], at[1], 2),  # the first trigger and its renewal
            (40.0, at[1], at[2], 1),  # deepened 35 s in: recorded when
            (10.0, at[2], at[3], 1),
        ]
        assert [i["reduction_kw"] for i in event.intervals] == [25.0, 50.0, 12.0]
        assert len(fast.transport.bodies) == 4  # every trigger reached the agents
        sent = list(fast.triggers)  # as GET /v1/fast/triggers lists them
        assert [t["event_id"] for t in sent] == [first["event_id"]] * 4
        assert [t["renewal"] for t in sent] == [False, True, True, True]
        assert [t["depth_pct"] for t in sent] == [20.0, 20.0, 40.0, 10.0]
        assert fast.holding
        # It completes at the last trigger's end, not the first's.
        await asyncio.sleep(0)
        clock.step(29.0)
        await asyncio.sleep(0)
        assert stored(fast)[0].status == "triggered"
        clock.step(1.0)
        for _ in range(3):
            await asyncio.sleep(0)
        assert stored(fast)[0].status == "completed"
        assert not fast.holding
        # A trigger after it ended is a new event.
        later = await fast.trigger(20.0, 5.0)
        assert later["renewal"] is False
        assert later["event_id"] != first["event_id"]
        assert len(stored(fast)) == 2

    asyncio.run(go())


def test_a_renewed_fast_event_is_settled_over_its_whole_length_stretch_by_stretch(tmp_path):
    """The meter of `test_settlement_meter` (110 kW in the 30 s before 14:00, its minutes
    reading 60 and 70 kW). A trigger at 14:00 (20 %, 25 kW planned, for 60 s), deepened at
    14:00:50 (40 %, 50 kW, for 70 s): one event to 14:02. Its first minute's target is the
    time-weighted mean of its stretches, (50 * 25 + 10 * 50) / 60 = 29.17 kW (met by 50 kW
    delivered), its second 50 kW (not met by 40); the meter after reads at 14:02."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    settings = settings_for(database_url, fast_depths="10,20,30,40", fast_secret=SECRET)
    store = Store(database_url)
    clock = SteppedClock(START)
    fast = FastPath(
        settings, store, clock, SimpleNamespace(nodes={"node-01": "mem://x"}), None, Taken()
    )
    fast.expected_kw = dict(EXPECTED_KW)
    try:
        write_day(store, EVENT_DAY, lambda slot: MINUTE_KW.get(slot, 105.0), length_s=60)
        write_samples(store, EVERY_SECOND)

        async def go() -> dict:
            first = await fast.trigger(20.0, 60.0)
            clock.step(50.0)
            assert (await fast.trigger(40.0, 70.0))["event_id"] == first["event_id"]
            clock.step(3600.0)
            return await Settlement(settings, store, clock).doc(first["event_id"])

        doc = asyncio.run(go())
    finally:
        fast.stop()
        store.close()
    (rule,) = doc["rules"]
    assert rule["rule"] == "meterbefore-30s"
    assert rule["meter_before"]["level_kw"] == 110.0
    rows = rule["intervals"]
    assert [r["target_kw"] for r in rows] == pytest.approx(
        [(50 * 25 + 10 * 50) / 60, 50.0], abs=1e-3
    )
    assert [r["delivered_kw"] for r in rows] == [50.0, 40.0]
    assert [r["met"] for r in rows] == [True, False]
    assert rule["meter_after"]["end"] == "2026-11-18T14:02:00+00:00"
