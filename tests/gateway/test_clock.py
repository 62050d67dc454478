"""The stepped clock: sleepers wake in deadline order as the clock passes their deadline."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gateway.clock import SteppedClock, SystemClock


def test_sleepers_wake_in_deadline_order_only_when_stepped_past():
    clock = SteppedClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    async def run():
        tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("late", 3.0), ("soon", 1.0))]
        await asyncio.sleep(0)
        assert clock.sleepers == 2
        clock.step(0.5)
        await asyncio.sleep(0)
        assert woke == []
        clock.step(2.5)
        await asyncio.gather(*tasks)
        assert woke == ["soon", "late"]

    asyncio.run(run())


def test_a_wall_step_leaves_monotonic_time_alone():
    start = datetime(2026, 6, 1, tzinfo=UTC)
    clock = SteppedClock(start)
    clock.step(10)
    clock.step_wall(-3600)
    assert clock.monotonic() == 10
    assert clock.now() == start + timedelta(seconds=10 - 3600)
    with pytest.raises(ValueError, match="monotonic time cannot go back"):
        clock.step(-1)


def test_the_system_clock_is_aware_utc():
    assert SystemClock().now().tzinfo is not None
