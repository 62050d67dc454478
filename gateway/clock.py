"""The gateway's clock: wall time for records and schedules, monotonic time for intervals.

Services take a `Clock` when they are built. `SystemClock` reads the process's clocks;
`SteppedClock` (tests, benchmarks on simulated time) moves only when it is stepped, and its
`sleep` returns once the clock has been stepped past the deadline, so a test can run an hour
of reconciliation in milliseconds, or step the wall clock alone while monotonic time runs on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps [s]."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's monotonic time."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class SteppedClock:
    """A clock that moves only when told: `step(s)` moves both clocks, `step_wall(s)` the wall
    clock alone (an NTP step). Sleepers wake, in deadline order, as their deadline is passed."""

    def __init__(self, start: datetime | None = None) -> None:
        self._wall = (start or datetime(2026, 1, 1, tzinfo=UTC)).astimezone(UTC)
        self._mono = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> datetime:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._order), woken))
        await woken

    def step(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("monotonic time cannot go back: use step_wall for a wall-clock step")
        self._mono += seconds
        self._wall += timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, woken = heapq.heappop(self._sleepers)
            if not woken.done():
                woken.set_result(None)

    def step_wall(self, seconds: float) -> None:
        self._wall += timedelta(seconds=seconds)

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting (a test steps once the services are all asleep)."""
        return sum(not f.done() for _, _, f in self._sleepers)
