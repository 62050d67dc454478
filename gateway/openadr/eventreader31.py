"""The 3.1 VEN's reading of the VTN's programs and events, polled (`poll`) or notified
(`notified`: the webhook's and MQTT's).

Each event is read (`signals31`) once per modification, **stored, then acted on**
(`ZeroNotice.accept`, the fast path's or `Events.accept`); one not acted on, or refused, is
logged and told to the VTN in a report. An event the VTN deletes, or stops listing, is
cancelled. A program's fallback limit (`safemode31`) is learned, not acted on. The programs
are kept for the events read against them, and for the MQTT topics the VEN follows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from pydantic import ValidationError

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.openadr.oadr31 import Event, Notification, Program, crud, first_error
from gateway.openadr.registration31 import Registration31, names
from gateway.openadr.reporter31 import Reporter
from gateway.openadr.reports31 import refusal_report
from gateway.openadr.safemode31 import SafeMode, is_fallback
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import Party31, RefusedEventError, modification_of, read_event31
from gateway.openadr.vtn31 import VtnClient
from gateway.openadr.zeronotice import ZeroNotice
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.grid import ExternalEvent
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.ven31")


class EventReader31:
    """The VTN's programs and events read for the grid protocol whose events are
    `<id_prefix>-<event id>`."""

    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock,
        vtn: VtnClient,
        registration: Registration31,
        safe_mode: SafeMode,
        reports: Reporter,
        events: Events,
        power: SitePower,
        fast: FastPath | None,
        id_prefix: str,
    ) -> None:
        """`fast`: the fast path zero-notice events matching an armed depth go through."""
        self.settings, self.clock, self.vtn = settings, clock, vtn
        self.registration, self.safe_mode, self.reports = registration, safe_mode, reports
        self.events, self.power, self.id_prefix = events, power, id_prefix
        self.zero_notice = ZeroNotice(settings, clock, events, fast)
        self.lock = asyncio.Lock()  #: held while an event is accepted (the fallbacks' too)
        self.programs: dict[str, Program] = {}
        self._handled: dict[str, int] = {}  #: event id -> the modification read
        self._read_at: dict[str, float] = {}  #: event id -> when it was last stored [s]
        self._rng = random.Random()

    @property
    def name(self) -> str:
        return self.settings.ven_name

    async def poll(self) -> None:
        """Read the programs and every event the VTN lists for this VEN; cancel those gone."""
        programs = {}
        for raw in await self.vtn.list("/programs"):
            try:
                program = Program.model_validate(raw)
            except ValidationError as exc:
                log.warning("a program is not a 3.1 program, skipped: %s", first_error(exc))
                continue
            if program.id:
                programs[program.id] = program
        self.programs = programs
        asked_at = self.clock.monotonic()
        listed = await self.vtn.list("/events")
        ids = {str(raw.get("id")) for raw in listed if isinstance(raw, dict)}
        for raw in listed:
            await self.handle(raw)
        await self._cancel_unlisted(ids, asked_at)

    async def _cancel_unlisted(self, ids: set[str], asked_at: float) -> None:
        """Cancel this VEN's live events the listing asked for at `asked_at` left out."""
        async with self.lock:
            for event in self.events.live():
                # One a notification brought after the listing was asked for is not gone.
                gone = (
                    event.external_id not in ids
                    and self._read_at.get(str(event.external_id), asked_at) <= asked_at
                )
                ours = event.id.startswith(f"{self.id_prefix}-")
                if not (ours and gone) or is_fallback(event.id):
                    continue
                self.reports.stop(str(event.external_id))
                try:
                    await self.events.cancel(event.id, "vtn")
                except ConflictError:  # it ended meanwhile
                    continue
                log.info("event %s: no longer listed by the VTN, cancelled", event.id)

    async def handle(self, raw: Any) -> bool:
        """One event as the VTN sent it: read, stored, acted on or refused with the reason.
        False when it could not even be stored (the store down): it is read again at the next
        poll, and the webhook answers 503, so nothing the VTN sent is lost."""
        event_id = str(raw.get("id")) if isinstance(raw, dict) and raw.get("id") else None
        async with self.lock:
            try:
                await self._handle(raw, event_id)
                return True
            except Exception as exc:  # the one place that catches everything
                log.exception("event %s could not be handled", event_id)
                if not event_id:
                    return True
                try:
                    await self._refuse(event_id, f"{type(exc).__name__}: {exc}")
                except Exception:
                    log.exception("event %s: not stored; read again at the next poll", event_id)
                    return False
                self._handled[event_id] = _modification_or_none(raw)  # not again until modified
                return True

    async def _handle(self, raw: Any, event_id: str | None) -> None:
        try:
            event = Event.model_validate(raw)
        except ValidationError as exc:
            why = f"not an OpenADR 3.1 event: {first_error(exc)}"
            if event_id is None:
                log.warning("an event without an id refused: %s", why)
            elif self._handled.get(event_id) != -1:
                await self._refuse(event_id, why)
                self._handled[event_id] = -1
            return
        if event.id is None:
            log.warning("an event without an id refused")
            return
        modification = modification_of(event)
        if self._handled.get(event.id) == modification:
            return  # read already
        program = self.programs.get(event.program_id)
        if self.safe_mode.learn(event, program.program_name if program else None):
            self._handled[event.id] = modification  # a definition, not a request
            return
        try:
            external = self._read(event, program)
        except RefusedEventError as exc:
            await self._refuse(event.id, str(exc))
            self._handled[event.id] = modification
            return
        await self._act(event, external, modification)

    def _read(self, event: Event, program: Program | None) -> ExternalEvent:
        """The event's facility reductions against the site's load now."""
        baseline, maximum = self.power.envelope()
        return read_event31(
            event,
            SiteLoad(baseline_facility_kw=baseline, max_capacity_kw=maximum),
            self.clock.now(),
            program,
            self._rng,
            self._party(),
        )

    async def _act(self, event: Event, external: ExternalEvent, modification: int) -> None:
        """Stored, then acted on (its reports scheduled) or not (the VTN told why)."""
        assert event.id is not None
        answer = await self.zero_notice.accept(external)
        opt, reason = answer.opt, answer.reason
        self._handled[event.id] = modification  # stored: only a new modification is read again
        self._read_at[event.id] = self.clock.monotonic()
        if answer.fast_event_id is not None:  # its reports settle the fast event
            log.info("event %s: fired through the fast path", event.id)
            self.reports.schedule(event, 0.0, self.power, answer.fast_event_id)
            return
        if opt == "out":
            log.info("event %s: not acted on (%s)", event.id, reason)
            self.reports.stop(event.id)
            await self.reports.post(refusal_report(event.id, self.name, reason or ""))
            return
        log.info("event %s: acted on", event.id)
        stored_id = self.events.external_id(event.id)
        self.reports.schedule(event, external.start_offset_s, self.power, stored_id)

    async def _refuse(self, event_id: str, reason: str) -> None:
        """Refused: logged, stored as failed (a stored version holds as it was), reported."""
        log.warning("event %s refused: %s", event_id, reason)
        self.events.refuse(event_id, reason)
        await self.reports.post(refusal_report(event_id, self.name, reason))

    async def deleted(self, event_id: str) -> None:
        """The VTN deleted the event: it is cancelled (User Guide 7.9)."""
        self._handled.pop(event_id, None)
        self.reports.stop(event_id)
        stored = self.events.external_id(event_id)
        if any(e.id == stored for e in self.events.live()):
            try:
                await self.events.cancel(stored, "vtn")
            except ConflictError:  # it ended meanwhile
                return
            log.info("event %s: deleted by the VTN, cancelled", event_id)

    def _party(self) -> Party31:
        registration = self.registration
        groups = set(names(self.settings.ven_groups))
        for obj in [registration.ven, *registration.resources]:
            if obj is not None:
                groups |= set(obj.targets or [])
        groups |= {r.resource_name for r in registration.resources}
        return Party31(self.name, frozenset(groups))

    async def notified(self, note: Notification) -> bool:
        """Act on a notification; False when its event could not be stored."""
        operation = crud(note.operation)
        if note.object_type == "EVENT" and operation == "DELETE":
            await self.deleted(str(note.object.get("id")))
        elif note.object_type == "EVENT":
            return await self.handle(note.object)
        elif note.object_type == "PROGRAM":
            try:
                program = Program.model_validate(note.object)
            except ValidationError as exc:
                log.warning("a notified program is refused: %s", first_error(exc))
                return True
            if program.id and operation != "DELETE":
                self.programs[program.id] = program
        return True


def _modification_or_none(raw: Any) -> int:
    try:
        return modification_of(Event.model_validate(raw))
    except ValidationError:
        return -1
