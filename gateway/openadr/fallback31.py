"""Safe mode acted on: each program's fallback limit (`safemode31`) held as an event of its own
while the VTN stays unreachable, renewed piece by piece, and lifted when it answers again."""

from __future__ import annotations

import asyncio
import logging

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.openadr.safemode31 import RENEW_BEFORE_S, SafeMode, event_id, is_fallback
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import read_event31
from gateway.services.events import Events
from gateway.services.site import SitePower
from gateway.store.models import as_utc

log = logging.getLogger("flexgate.ven31")


class Fallbacks31:
    def __init__(
        self,
        safe_mode: SafeMode,
        clock: Clock,
        events: Events,
        power: SitePower,
        lock: asyncio.Lock,
    ) -> None:
        """`lock`: the VEN's, held while an event is accepted."""
        self.safe_mode, self.clock = safe_mode, clock
        self.events, self.power, self._lock = events, power, lock

    async def hold(self) -> None:
        """The VTN unreachable longer than FLEXGATE_VTN_FALLBACK_AFTER_S: each program's
        fallback limit held, as an event of its own (again if it ended meanwhile)."""
        if not self.safe_mode.lost_contact(self.clock.monotonic()):
            return
        live = {e.id for e in self.events.live()}
        for name, limit_kw in self.safe_mode.limits_kw().items():
            stored = self.events.external_id(event_id(name))
            if name in self.safe_mode.holding and self._held_on(stored, live):
                continue
            try:
                baseline, maximum = self.power.envelope()
                event = self.safe_mode.fallback_event(name, limit_kw, self.clock.now())
                external = read_event31(
                    event,
                    SiteLoad(baseline_facility_kw=baseline, max_capacity_kw=maximum),
                    self.clock.now(),
                )
                async with self._lock:
                    opt, reason = await self.events.accept(external)
            except Exception:  # the VEN goes on; tried again at the next failed poll
                log.exception("safe mode: program %s's fallback limit not held", name)
                continue
            self.safe_mode.holding.add(name)
            if opt == "out":
                log.warning("safe mode: program %s's fallback limit not held: %s", name, reason)
                continue
            assert self.safe_mode.unreachable_since is not None
            log.warning(
                "safe mode: the VTN unreachable for %.0f s: holding program %s's fallback "
                "limit of %g kW (%s)",
                self.clock.monotonic() - self.safe_mode.unreachable_since,
                name,
                limit_kw,
                stored,
            )

    def _held_on(self, stored: str, live: set[str]) -> bool:
        """A fallback event that needs no renewal yet (or the site cannot hold it: said when
        it was opted out)."""
        row = self.events.get(stored)
        if row.status == "opted_out":
            return True
        left_s = (as_utc(row.end) - self.clock.now()).total_seconds()
        return stored in live and left_s > RENEW_BEFORE_S

    async def lift(self) -> None:
        """Contact again: every fallback limit held is lifted (one from before a restart too)."""
        self.safe_mode.unreachable_since = None
        self.safe_mode.holding.clear()
        for event in self.events.live():
            if not is_fallback(event.id):
                continue
            try:
                await self.events.cancel(event.id, "vtn")
            except ConflictError:  # it ended meanwhile
                continue
            log.info("safe mode: the VTN answers again: %s lifted", event.id)
