"""The OpenADR 3.1 VEN: a REST client of the VTN, feeding the gateway's events.

`FLEXGATE_OPENADR=3.1`. With an OAuth2 token (`oauth`), it finds or creates its ven object
and its resources, and subscribes to event notifications when FLEXGATE_VEN_CALLBACK_URL is set
(`registration31`: a refused subscription asked again with backoff); the gateway serves the
callback (`webhook31`: the echo challenge, the subscription's bearer token, each notification
answered at once and acted on after, a malformed one refused and followed by a poll). It reads
programs and events every FLEXGATE_VTN_POLL_S whatever the webhook does (the fallback, and the
check on what it missed).

When the VTN's `GET /notifiers` offers MQTT (and FLEXGATE_VTN_MQTT is on), it also connects to
the broker (`notifiers31`, `mqtt31`) and follows the event topics of each program it reads
(`GET /notifiers/mqtt/topics/programs/{programID}/events`); a message is read exactly as a
webhook notification is. Webhook and MQTT may both deliver an event: one already read (the same
modification) is not read again.

Every event is read into an `ExternalEvent` (`signals31`), **stored, then acted on**
(`Events.accept`); one not acted on, or refused, is logged and told to the VTN in a report
(OpenADR 3 has no opt message: an OPERATING_STATE `RUNNING_OPTED_OUT` report whose reportName
carries the reason). An event the VTN deletes, or stops listing, is cancelled. An event the
VTN modifies (a new modificationDateTime) is read again. While the VTN is unreachable, the VEN
retries with backoff and the stored events run on: each ends at its own end.

Its requests go through `vtn31` (a fresh token each, lists by pages). Reports (`reports31`
builds them, `reporter31` sends them): at the end of each interval of an event acted on whose
reportDescriptors ask for DEMAND, USAGE, BASELINE or DELTA_USAGE, the site's facility and GPU
figures (the facility's from the event's settlement under `FLEXGATE_REPORT_BASELINE` if set).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import httpx
from pydantic import ValidationError

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.openadr.fallback31 import Fallbacks31
from gateway.openadr.notifiers31 import MqttFollower
from gateway.openadr.oadr31 import (
    Event,
    Notification,
    Program,
    crud,
    first_error,
)
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.registration31 import Registration31, names
from gateway.openadr.reporter31 import Reporter
from gateway.openadr.reports31 import refusal_report
from gateway.openadr.safemode31 import SafeMode, is_fallback, parse_limits
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import (
    Party31,
    RefusedEventError,
    modification_of,
    read_event31,
)
from gateway.openadr.vtn31 import VtnClient, VtnError
from gateway.openadr.webhook31 import Webhook31
from gateway.openadr.zeronotice import ZeroNotice
from gateway.retries import VTN_BACKOFF
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow

log = logging.getLogger("flexgate.ven31")


class Ven31:
    """The grid protocol `openadr` over OpenADR 3.1: events `oadr3-<event id>`."""

    source = "openadr"
    id_prefix = "oadr3"

    def __init__(
        self, settings: GatewaySettings, clock: Clock, http: httpx.AsyncClient | None = None
    ) -> None:
        self.settings, self.clock = settings, clock
        http = http or httpx.AsyncClient(timeout=settings.dispatch_timeout_s)
        self.tokens = TokenSource(
            http,
            clock,
            vtn_url=settings.vtn_url.rstrip("/"),
            client_id=settings.vtn_client_id,
            client_secret=settings.vtn_client_secret,
            token_url=settings.vtn_token_url,
            allow_http=settings.lab or settings.vtn_allow_http,
            client_auth=settings.vtn_client_auth,
        )
        self.vtn = VtnClient(http, self.tokens, settings.vtn_url)
        self.reports = Reporter(self.vtn, clock, settings.ven_name)
        self.safe_mode = SafeMode(
            parse_limits(settings.vtn_fallback_limits),
            settings.vtn_fallback_event,
            settings.vtn_fallback_after_s,
        )
        self.notifications = MqttFollower(
            settings, self.vtn, self.tokens, self.notified, self._poll_soon
        )
        self._poll_now = asyncio.Event()  #: set: poll without waiting FLEXGATE_VTN_POLL_S
        self.webhook = Webhook31(self.notified, self._poll_now)
        self.registration = Registration31(settings, clock, self.vtn, self.webhook.token)
        self._inbox_task: asyncio.Task[None] | None = None
        self.programs: dict[str, Program] = {}
        self.reachable = False
        self._handled: dict[str, int] = {}  #: event id -> the modification read
        self._read_at: dict[str, float] = {}  #: event id -> when it was last stored [s]
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._events: Events | None = None
        self._power: SitePower | None = None
        self._fallbacks: Fallbacks31 | None = None
        self._zero_notice: ZeroNotice | None = None
        self._lock = asyncio.Lock()

    # --- GridProtocol ----------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self.registration.ven is None:
            return "registering"
        return "registered" if self.reachable else "registered, VTN unreachable"

    async def opt_out(self, event: EventRow) -> None:
        """An event cancelled on the site: the VTN hears it in a report with the reason."""
        assert event.external_id is not None
        if is_fallback(event.id):  # flexgate's own, unknown to the VTN
            return
        self.reports.stop(event.external_id)
        await self.reports.post(refusal_report(event.external_id, self.name, event.reason or ""))

    # --- life ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.settings.ven_name

    @property
    def events(self) -> Events:
        assert self._events is not None, "the VEN has not been started"
        return self._events

    @property
    def fallbacks(self) -> Fallbacks31:
        assert self._fallbacks is not None, "the VEN has not been started"
        return self._fallbacks

    async def start(
        self,
        events: Events,
        power: SitePower,
        baseline: ProgramBaseline | None = None,
        fast: FastPath | None = None,
    ) -> None:
        """Run, feeding `events` (zero-notice events matching an armed depth: `fast`, through
        `ZeroNotice`); `power` and the program's rule (`baseline`) answer reports."""
        self._events, self._power = events, power
        self._fallbacks = Fallbacks31(self.safe_mode, self.clock, events, power, self._lock)
        self._zero_notice = ZeroNotice(self.settings, self.clock, events, fast)
        self.reports.baseline = baseline
        self._task = asyncio.create_task(self._run())
        self._inbox_task = asyncio.create_task(self.webhook.work())

    async def stop(self) -> None:
        for task in (self._task, self._inbox_task):
            if task is not None:
                task.cancel()
        self.reports.stop_all()
        await self.notifications.stop()
        await self.registration.unsubscribe()
        await self.vtn.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await VTN_BACKOFF.call(
                    self.clock, self._round, on=(VtnError, VtnAuthError), before_sleep=self._lost
                )
            except Exception:  # a bug must not end the VEN: say so, and go on
                log.exception("the VEN's poll failed")
                await self.clock.sleep(VTN_BACKOFF.most_s)

    async def _round(self) -> None:
        """One poll of the VTN (registered and subscribed first where it is not yet), then
        the wait for the next."""
        registration = self.registration
        if registration.ven is None:
            await registration.register()
            self.reachable = True
        if registration.subscription_id is None and self.settings.ven_callback_url:
            await registration.try_subscribe()
        if self.settings.vtn_mqtt and not self.notifications.asked:
            await self.notifications.connect()
        await self.poll()
        await self.fallbacks.lift()
        await self.notifications.follow(set(self.programs))
        self.reachable = True
        await self.reports.send_undelivered()
        await self._until_next_poll()

    async def _lost(self, exc: BaseException, delay_s: float) -> None:
        self.reachable = False
        log.warning("VTN: %s; the stored events run on; retrying in %g s", exc, delay_s)
        await self.fallbacks.hold()

    async def _until_next_poll(self) -> None:
        """FLEXGATE_VTN_POLL_S, or less when MQTT asks for a poll (after a reconnection)."""
        sleeping = asyncio.ensure_future(self.clock.sleep(self.settings.vtn_poll_s))
        woken = asyncio.ensure_future(self._poll_now.wait())
        try:
            await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()
        self._poll_now.clear()

    def _poll_soon(self) -> None:
        log.info("MQTT: subscribed again after a reconnection; polling for what was missed")
        self._poll_now.set()

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
        async with self._lock:
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

    # --- events ----------------------------------------------------------------------------

    async def handle(self, raw: Any) -> bool:
        """One event as the VTN sent it: read, stored, acted on or refused with the reason.
        False when it could not even be stored (the store down): it is read again at the next
        poll, and the webhook answers 503, so nothing the VTN sent is lost."""
        event_id = str(raw.get("id")) if isinstance(raw, dict) and raw.get("id") else None
        async with self._lock:
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
        assert self._power is not None
        baseline, maximum = self._power.envelope()
        try:
            external = read_event31(
                event,
                SiteLoad(baseline_facility_kw=baseline, max_capacity_kw=maximum),
                self.clock.now(),
                self.programs.get(event.program_id),
                self._rng,
                self._party(),
            )
        except RefusedEventError as exc:
            await self._refuse(event.id, str(exc))
            self._handled[event.id] = modification
            return
        assert self._zero_notice is not None
        answer = await self._zero_notice.accept(external)
        opt, reason = answer.opt, answer.reason
        self._handled[event.id] = modification  # stored: only a new modification is read again
        self._read_at[event.id] = self.clock.monotonic()
        if answer.fast_event_id is not None:  # its reports settle the fast event
            log.info("event %s: fired through the fast path", event.id)
            self.reports.schedule(event, 0.0, self._power, answer.fast_event_id)
            return
        if opt == "out":
            log.info("event %s: not acted on (%s)", event.id, reason)
            self.reports.stop(event.id)
            await self.reports.post(refusal_report(event.id, self.name, reason or ""))
            return
        log.info("event %s: acted on", event.id)
        stored_id = self.events.external_id(event.id)
        self.reports.schedule(event, external.start_offset_s, self._power, stored_id)

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

    # --- notifications ---------------------------------------------------------------------

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
