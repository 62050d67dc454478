"""A step run every period on the gateway's clock, in a task of its own: a step that fails is
logged with what it was doing, and the next period tries again (the reconciler, the measured
curves' harvest, the PFI predictions)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.clock import Clock

log = logging.getLogger("flexgate.gateway")


class Every:
    def __init__(
        self, clock: Clock, period_s: float, step: Callable[[], Awaitable[object]], failed: str
    ) -> None:
        """`failed`: what the log says when a step raises ("reconciliation failed")."""
        self.clock, self.period_s, self.step, self.failed = clock, period_s, step, failed
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._forever())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _forever(self) -> None:
        while True:
            await self.clock.sleep(self.period_s)
            try:
                await self.step()
            except Exception:  # the next period tries again
                log.exception(self.failed)
