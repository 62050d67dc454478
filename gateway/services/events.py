"""Events: stored before anything acts on them, started and ended on time, answered.

- Manual events (`POST /v1/events`) and external ones from a grid protocol (`accept`), which
  are opted in or out first (`gateway.services.eventintake`: a request becomes its row;
  `gateway.services.optpolicy`: the source's own verdict, then the site's policy; running ones
  checked again). Their records: `gateway.services.eventrecords`.
- APScheduler (3.x, on the wall clock, as events are; `gateway.services.eventschedule`) starts
  and ends them and steps their intervals; on start the jobs are rebuilt from the store and
  events that ended meanwhile are completed (`resume`); `catch_up` does the same for moments
  missed while the store was down.
- Whenever the active events change, the strictest active target (the largest reduction now)
  goes to `Targets.hold`; when none is left, `Targets.release` steps the caps back.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.services.counted import Counted
from gateway.services.eventintake import EventIntake
from gateway.services.eventrecords import LIVE, EventRecords
from gateway.services.eventschedule import EventSchedule
from gateway.services.grid import ExternalEvent, GridProtocol
from gateway.services.intervals import level_now, reduction_now
from gateway.services.jobbook import JobBook
from gateway.services.optpolicy import OptPolicy
from gateway.services.quotes import Quotes
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow, as_utc

log = logging.getLogger("flexgate.gateway")


class Events(EventRecords):
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        book: JobBook,
        power: SitePower,
        quotes: Quotes,
        targets: Targets,
        tracker: Tracker,
        grid: GridProtocol | None = None,
    ) -> None:
        super().__init__(store, clock)
        self.settings, self.book, self.power, self.quotes = settings, book, power, quotes
        self.grid, self.targets, self.tracker = grid, targets, tracker
        self.counted = Counted(settings, store, clock, power)
        self.policy = OptPolicy(settings, power, quotes, targets, self.counted)
        self.intake = EventIntake(settings, clock, power, quotes, self.policy)
        self.scheduler = EventSchedule(clock, self.begin, self.finish, self.apply_targets)

    async def start(self) -> None:
        self.scheduler.start()
        await self.resume()

    def stop(self) -> None:
        self.scheduler.stop()

    def strictest(self) -> tuple[EventRow, float] | None:
        """The active event whose target is the largest now, and that target [kW]."""
        now, baseline_kw = self.clock.now(), self.power.envelope()[0]
        targets = [(e, reduction_now(e, now, baseline_kw)) for e in self.active()]
        return max(targets, key=lambda t: t[1], default=None)

    # --- manual events -------------------------------------------------------------------

    async def create(
        self,
        *,
        reduction_kw: float,
        start: datetime,
        duration_s: float,
        source: str,
        actor: str,
        force: bool = False,
    ) -> EventRow:
        """A manual event, stored and armed; refused, nothing stored, as
        `EventIntake.manual` says."""
        event = await self.intake.manual(
            reduction_kw=reduction_kw,
            start=start,
            duration_s=duration_s,
            source=source,
            force=force,
        )
        with self.store.session() as s:
            repo.add_event(s, event=event)
            self._audit(s, actor, "events.create", {"id": event.id, "reduction_kw": reduction_kw})
            s.commit()
        self.scheduler.arm(event)
        return event

    # --- external events -----------------------------------------------------------------

    def external_id(self, event_id: str) -> str:
        assert self.grid is not None
        return f"{self.grid.id_prefix}-{event_id}"

    async def accept(self, external: ExternalEvent) -> tuple[str, str | None]:
        """Store an external event, act on it, and say whether we opt in.

        Stored before it is answered; an older modification than the one stored is refused;
        a cancellation cancels; a test event is answered and never acted on.
        """
        assert self.grid is not None
        event_id = self.external_id(external.event_id)
        with self.store.session() as s:
            known = repo.get_event(s, event_id=event_id)
        if known is not None and external.modification < known.modification:
            return known.opt, (
                f"modification {external.modification} is older than {known.modification}"
            )
        if external.status == "cancelled":
            if known is not None and known.status in LIVE:
                await self.cancel(event_id, "vtn")
            return "in", None
        row = await self.intake.external(external, event_id, self.grid.source)
        with self.store.session() as s:
            repo.replace_event(s, event=row)
            self._audit(
                s,
                "vtn",
                f"events.{self.grid.source}",
                {"id": event_id, "modification": external.modification, "opt": row.opt},
            )
            s.commit()
        if row.opt == "in" and not external.test and external.intervals:
            self.scheduler.arm(row)
        return row.opt, row.reason

    def refuse(self, event_id: str, reason: str) -> None:
        """An external event that could not be handled at all: stored as failed, opted out."""
        assert self.grid is not None
        failed = self.intake.failed(event_id, self.external_id(event_id), self.grid.source, reason)
        with self.store.session() as s:
            if repo.get_event(s, event_id=failed.id) is None:
                repo.add_event(s, event=failed)
                s.commit()

    async def cancel_unlisted(self, listed: set[str]) -> list[str]:
        """Cancel every live external event whose id the source no longer lists; their ids."""
        assert self.grid is not None
        source = self.grid.source
        gone = [e.id for e in self.live() if e.source == source and e.external_id not in listed]
        for event_id in gone:
            await self.cancel(event_id, "vtn")
        return gone

    async def _revisit(self) -> None:
        """Events opted in whose target (a level follows the load) the site's job mix can no
        longer shed, or (FLEXGATE_OPT_IN_BASELINE) whose recount falls short: external ones
        opted out, with the reason, and the source told (as 2.0b allows); a manual one's
        recount is stored, its shortfall stated. Nodes silent now do not count: the targets
        are re-planned around them."""
        if not self.policy.rechecks:
            return
        source = None if self.grid is None else self.grid.source
        held = [
            e
            for e in self.live()
            if ((e.source == source and e.opt == "in") or e.source == "manual") and not e.test
        ]
        baseline_kw, now = self.power.envelope()[0], self.clock.now()
        for event in held:
            _, short = await self.policy.recheck(event, baseline_kw, now)
            if short is not None:
                reason = f"the site changed: {short}"
                log.info("event %s: opting out (%s)", event.id, reason)
                await self._opt_out_locally(event.id, reason=reason)
                self._move(event.id, LIVE, "opted_out", actor="site")

    # --- the life of an event ------------------------------------------------------------

    async def begin(self, event_id: str) -> None:
        baseline_kw = self.power.envelope()[0]  # what its shares are taken against
        if self._move(event_id, ("pending",), "active", baseline_kw=baseline_kw):
            await self.apply_targets()

    async def finish(self, event_id: str) -> None:
        if self._complete(event_id):
            await self.apply_targets()

    async def cancel(self, event_id: str, actor: str) -> EventRow:
        event = self.get(event_id)
        if event.status not in LIVE:
            raise ConflictError(f"event '{event_id}' is {event.status}: nothing to cancel")
        if self.grid is not None and event.source == self.grid.source and actor != "vtn":
            await self._opt_out_locally(event_id, reason=f"cancelled on the site by {actor}")
        self._move(event_id, LIVE, "cancelled", actor=actor)
        self.scheduler.disarm(event_id)
        if event.status == "active":  # a pending event has set no target
            await self.apply_targets()
        return self.get(event_id)

    async def _opt_out_locally(self, event_id: str, reason: str) -> None:
        """An external event given up on our side: stored as an opt-out and the source told,
        first, waiting at most `dispatch_timeout_s` so the restore is never held up."""
        assert self.grid is not None
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            assert event is not None
            event.opt, event.reason = "out", reason
            s.add(event)
            s.commit()
            s.refresh(event)
        try:
            await asyncio.wait_for(self.grid.opt_out(event), self.settings.dispatch_timeout_s)
        except Exception:  # the GPUs are restored either way; say the source was not told
            log.exception("event %s: the VTN could not be told of the opt-out", event_id)

    def _complete(self, event_id: str) -> bool:
        if not self._move(event_id, LIVE, "completed"):
            return False
        self.quotes.history_changed()  # its delivery at the meter is part of the record now
        return True

    async def resume(self) -> None:
        """After a restart: finish what ended while down, schedule the rest, re-plan."""
        now = self.clock.now()
        for event in self.live():
            if as_utc(event.end) <= now:
                self._complete(event.id)
            else:
                self.scheduler.arm(event)
        await self.apply_targets(resumed=True)

    async def catch_up(self) -> None:
        """Start and end the events whose scheduled moment passed while the store was down."""
        now = self.clock.now()
        for event in self.live():
            if as_utc(event.end) <= now:
                await self.finish(event.id)
            elif event.status == "pending" and as_utc(event.start) <= now:
                await self.begin(event.id)

    async def apply_targets(self, resumed: bool = False) -> None:
        """Hold the strictest active target, or release the caps when none is left."""
        await self._revisit()
        strictest = self.strictest()
        if strictest is not None:
            event, target_kw = strictest
            level_kw, ceiling = level_now(event, self.clock.now())
            await self.tracker.pursue(event.id, target_kw, level_kw, ceiling=ceiling)
        else:
            self.tracker.release()
            if self.targets.holding or resumed:
                self.targets.release()
