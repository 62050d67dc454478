"""Events: stored before anything acts on them, started and ended on time, answered.

- Manual events (`POST /v1/events`) and external ones from a grid protocol (`accept`), which
  are opted in or out first (`gateway.services.optpolicy`: the source's own verdict, then the
  site's policy; running ones checked again).
- APScheduler (3.x, on the wall clock, as events are) starts and ends them and steps their
  intervals; on start the jobs are rebuilt from the store and events that ended meanwhile are
  completed (`resume`); `catch_up` does the same for moments missed while the store was down.
- Whenever the active events change, the strictest active target (the largest reduction now)
  goes to `Targets.hold`; when none is left, `Targets.release` steps the caps back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gateway.clock import Clock
from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.services.counted import Counted
from gateway.services.grid import ExternalEvent, GridProtocol, Interval
from gateway.services.intervals import level_now, reduction_now, stored_doc
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
LIVE = ("pending", "active")


class Events:
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
        self.settings, self.store, self.clock = settings, store, clock
        self.book, self.power, self.quotes, self.grid = book, power, quotes, grid
        self.targets, self.tracker = targets, tracker
        self.counted = Counted(settings, store, clock, power)
        self.policy = OptPolicy(settings, power, quotes, targets, self.counted)
        self.scheduler = AsyncIOScheduler(timezone=UTC)

    async def start(self) -> None:
        self.scheduler.start()
        await self.resume()

    def stop(self) -> None:
        self.scheduler.shutdown(wait=False)

    # --- reading -------------------------------------------------------------------------

    def get(self, event_id: str) -> EventRow:
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
        if event is None:
            raise NotFoundError(f"no event '{event_id}'")
        return event

    def live(self) -> list[EventRow]:
        with self.store.session() as s:
            return repo.list_events(s, statuses=LIVE)

    def active(self) -> list[EventRow]:
        """The active events that act on the site (test events never do)."""
        with self.store.session() as s:
            return [e for e in repo.list_events(s, statuses=("active",)) if not e.test]

    def strictest(self) -> tuple[EventRow, float] | None:
        """The active event whose target is the largest now, and that target [kW]."""
        now, baseline_kw = self.clock.now(), self.power.envelope()[0]
        targets = [(e, reduction_now(e, now, baseline_kw)) for e in self.active()]
        return max(targets, key=lambda t: t[1], default=None)

    def all(self, limit: int | None = None) -> list[Any]:
        """Every event by start, or the last `limit`, as plain rows with `EventRow`'s
        attributes (for `EventDocs.describe`)."""
        with self.store.session() as s:
            return repo.event_rows(s, limit)

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
        """A manual event, stored and armed. Refused (nothing stored) when its start has no
        zone, it ends in the past, the fleet runs simulated GPUs outside the lab, or it asks
        more than `event_max_overreach` times what the site can shed now, unless `force`."""
        if start.tzinfo is None:
            raise InvalidRequestError("start: give a time zone (e.g. 2026-11-29T16:00:00Z)")
        if not (math.isfinite(reduction_kw) and reduction_kw > 0):
            raise InvalidRequestError("reduction_kw must be a positive number")
        end = start + timedelta(seconds=duration_s)
        now = self.clock.now()
        if end <= now:
            raise InvalidRequestError(f"the event would end at {end.isoformat()}, in the past")
        simulated = self.power.fleet.simulated_refusal()
        if simulated:
            raise InvalidRequestError(f"no plan may rest on simulated GPUs here: {simulated}")
        most_kw = self.quotes.firm(duration_s, self.settings.opt_confidence)["achievable_kw"]
        overreach = self.settings.event_max_overreach
        # Nothing to compare with while the site can shed nothing (no agent reports yet).
        if not force and most_kw > 0 and reduction_kw > overreach * most_kw:
            raise InvalidRequestError(
                f"reduction_kw: {reduction_kw:g} kW is {reduction_kw / most_kw:.0f} times what "
                f"the site can shed now ({most_kw:.1f} kW; refused above "
                f"FLEXGATE_EVENT_MAX_OVERREACH={overreach:g} times): watts typed as kW? Send "
                '"force": true to store it anyway'
            )
        feasible = reduction_kw <= most_kw * (1 + 1e-9)
        counted = await self.policy.count(start, end, reduction_kw)
        reasons = (
            []
            if feasible
            else [
                f"asks for {reduction_kw:g} kW; the site can shed at most {most_kw:.1f} kW now: "
                "the plan will deliver that and state the shortfall"
            ]
        )
        if counted is not None and counted["short"]:  # the operator's event: stated, kept
            reasons.append(counted["short"])
        event = EventRow(
            feasible=feasible,
            reason="; ".join(reasons) or None,
            counted=counted,
            intervals=[stored_doc(Interval(start, end, reduction_kw))],
            id=f"ev-{uuid.uuid4().hex[:12]}",
            source=source,
            status="pending",
            start=start.astimezone(UTC),
            end=end.astimezone(UTC),
            reduction_kw=reduction_kw,
            created_at=now,
        )
        with self.store.session() as s:
            repo.add_event(s, event=event)
            self._audit(s, actor, "events.create", {"id": event.id, "reduction_kw": reduction_kw})
            s.commit()
        self._arm(event)
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
        opt, reason = self.policy.verdict(external)
        counted = None
        if opt == "in" and not external.test and external.intervals:
            counted = await self.policy.count(
                external.intervals[0].start,
                external.intervals[-1].end,
                max(i.reduction_kw for i in external.intervals),
            )
        if counted is not None and counted["short"]:
            opt, reason = "out", counted["short"]
        now = self.clock.now()
        start = external.start or now
        row = EventRow(
            id=event_id,
            source=self.grid.source,
            status="opted_out" if opt == "out" else "pending",
            start=start,
            end=external.end or start,
            reduction_kw=max((i.reduction_kw for i in external.intervals), default=0.0),
            intervals=[stored_doc(i) for i in external.intervals],
            opt=opt,
            reason=reason,
            external_id=external.event_id,
            modification=external.modification,
            test=external.test,
            created_at=now,
            counted=counted,
        )
        with self.store.session() as s:
            repo.replace_event(s, event=row)
            self._audit(
                s,
                "vtn",
                f"events.{self.grid.source}",
                {"id": event_id, "modification": external.modification, "opt": opt},
            )
            s.commit()
        if opt == "in" and not external.test and external.intervals:
            self._arm(row)
        return opt, reason

    def refuse(self, event_id: str, reason: str) -> None:
        """An external event that could not be handled at all: stored as failed, opted out."""
        assert self.grid is not None
        now = self.clock.now()
        with self.store.session() as s:
            if repo.get_event(s, event_id=self.external_id(event_id)) is None:
                repo.add_event(
                    s,
                    event=EventRow(
                        id=self.external_id(event_id),
                        source=self.grid.source,
                        status="failed",
                        start=now,
                        end=now,
                        reduction_kw=0.0,
                        intervals=[],
                        opt="out",
                        reason=reason,
                        external_id=event_id,
                        created_at=now,
                    ),
                )
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

    def _arm(self, event: EventRow) -> None:
        """Scheduler jobs for the event's start, end and each change of its target."""
        now = self.clock.now()
        for action, when in (("start", event.start), ("end", event.end)):
            self.scheduler.add_job(
                self.begin if action == "start" else self.finish,
                "date",
                run_date=max(as_utc(when), now),
                args=[event.id],
                id=f"{action}-{event.id}",
                replace_existing=True,
            )
        for k, interval in enumerate(event.intervals[1:], start=1):
            when = datetime.fromisoformat(interval["start"])
            if when > now:
                self.scheduler.add_job(
                    self.apply_targets,
                    "date",
                    run_date=when,
                    id=f"step-{event.id}-{k}",
                    replace_existing=True,
                )

    async def begin(self, event_id: str) -> None:
        baseline_kw = self.power.envelope()[0]  # what its shares are taken against
        if self._move(event_id, ("pending",), "active", baseline_kw=baseline_kw):
            await self.apply_targets()

    async def finish(self, event_id: str) -> None:
        if self._move(event_id, LIVE, "completed"):
            await self.apply_targets()

    async def cancel(self, event_id: str, actor: str) -> EventRow:
        event = self.get(event_id)
        if event.status not in LIVE:
            raise ConflictError(f"event '{event_id}' is {event.status}: nothing to cancel")
        if self.grid is not None and event.source == self.grid.source and actor != "vtn":
            await self._opt_out_locally(event_id, reason=f"cancelled on the site by {actor}")
        self._move(event_id, LIVE, "cancelled", actor=actor)
        for job in (f"start-{event_id}", f"end-{event_id}"):
            if self.scheduler.get_job(job):
                self.scheduler.remove_job(job)
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

    def _move(
        self,
        event_id: str,
        sources: tuple[str, ...],
        target: str,
        actor: str = "scheduler",
        baseline_kw: float | None = None,
    ) -> bool:
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            if event is None or event.status not in sources:
                return False
            event.status = target
            if baseline_kw is not None:
                event.baseline_kw = baseline_kw
            s.add(event)
            self._audit(s, actor, f"events.{target}", {"id": event_id})
            s.commit()
        if target == "completed":  # its delivery at the meter is part of the record now
            self.quotes.history_changed()
        return True

    def _audit(self, session: Any, actor: str, action: str, detail: dict[str, Any]) -> None:
        repo.audit(session, actor=actor, action=action, detail=detail, at=self.clock.now())

    async def resume(self) -> None:
        """After a restart: finish what ended while down, schedule the rest, re-plan."""
        now = self.clock.now()
        for event in self.live():
            if as_utc(event.end) <= now:
                self._move(event.id, LIVE, "completed")
            else:
                self._arm(event)
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
