"""The OpenADR 3.1 VEN: a REST client of the VTN, feeding the gateway's events.

`FLEXGATE_OPENADR=3.1`. With an OAuth2 token (`oauth`), it finds or creates its ven object
(`venName` = FLEXGATE_VEN_NAME) and its resources (FLEXGATE_VEN_RESOURCES), subscribes to event
notifications when FLEXGATE_VEN_CALLBACK_URL is set (the gateway serves the callback, `router`:
it answers the VTN's echo challenge, `GET <callbackUrl>?echo=` and `GET <callbackUrl>/echo?echo=`;
a notification must carry the subscription's bearer token), and reads programs and events every
FLEXGATE_VTN_POLL_S whatever the webhook does (the fallback, and the check on what it missed).

A subscription the VTN refuses is asked for again with backoff (`SUBSCRIBE_BACKOFF`), not at
every poll; before each, the VEN deletes its own left on the VTN (`GET /subscriptions`, matched
on clientName and callback URL): a VTN may store one and still answer an error, and one left by
a previous run carries a bearer token nobody holds any more. A notification is answered as soon
as it is read, and acted on after (`_inbox`): a VTN that posts notifications synchronously and
serves one request at a time would otherwise wait for the VEN's own requests (a refusal
report) to time out. A malformed notification is refused with the reason, logged, and the VEN
polls at once.
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
import hmac
import logging
import random
import secrets
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.openadr.notifiers31 import MqttFollower
from gateway.openadr.oadr31 import (
    Event,
    Notification,
    Program,
    Resource,
    Subscription,
    Ven,
    crud,
    first_error,
)
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.reporter31 import Reporter
from gateway.openadr.reports31 import refusal_report
from gateway.openadr.safemode31 import ID_PREFIX as FALLBACK_PREFIX
from gateway.openadr.safemode31 import RENEW_BEFORE_S as FALLBACK_RENEW_BEFORE_S
from gateway.openadr.safemode31 import SafeMode, parse_limits
from gateway.openadr.safemode31 import event_id as fallback_id
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import (
    Party31,
    RefusedEventError,
    modification_of,
    read_event31,
)
from gateway.openadr.vtn31 import VtnClient, VtnError, valid
from gateway.openadr.zeronotice import ZeroNotice
from gateway.retries import SUBSCRIBE_BACKOFF, VTN_BACKOFF
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow, as_utc

log = logging.getLogger("flexgate.ven31")

#: The path the gateway serves the VTN's notifications on.
CALLBACK_PATH = "/openadr3/notifications"
#: Notifications read and waiting to be acted on; more are answered 503 (the poll reads them).
INBOX_MAX = 1000


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
        #: The bearer token the VTN must present on the callback (the subscription's).
        self.callback_token = secrets.token_urlsafe(32)
        self.ven: Ven | None = None
        self.resources: list[Resource] = []
        self.subscription_id: str | None = None
        self._subscribe_error: str | None = None
        self._subscribe_failures = 0
        self._subscribe_at = 0.0  #: no subscription attempt before this [s, monotonic]
        self._inbox: asyncio.Queue[Notification] = asyncio.Queue(INBOX_MAX)
        self._inbox_task: asyncio.Task[None] | None = None
        self._malformed_said: set[str] = set()  #: reasons for refused notifications logged
        self.programs: dict[str, Program] = {}
        self.reachable = False
        self._handled: dict[str, int] = {}  #: event id -> the modification read
        self._read_at: dict[str, float] = {}  #: event id -> when it was last stored [s]
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._events: Events | None = None
        self._power: SitePower | None = None
        self._zero_notice: ZeroNotice | None = None
        self._lock = asyncio.Lock()
        self._poll_now = asyncio.Event()  #: set: poll without waiting FLEXGATE_VTN_POLL_S

    # --- GridProtocol ----------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self.ven is None:
            return "registering"
        return "registered" if self.reachable else "registered, VTN unreachable"

    async def opt_out(self, event: EventRow) -> None:
        """An event cancelled on the site: the VTN hears it in a report with the reason."""
        assert event.external_id is not None
        if self._fallback(event):  # flexgate's own, unknown to the VTN
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
        self._zero_notice = ZeroNotice(self.settings, self.clock, events, fast)
        self.reports.baseline = baseline
        self._task = asyncio.create_task(self._run())
        self._inbox_task = asyncio.create_task(self._work_inbox())

    async def stop(self) -> None:
        for task in (self._task, self._inbox_task):
            if task is not None:
                task.cancel()
        self.reports.stop_all()
        await self.notifications.stop()
        if self.subscription_id is not None:
            try:
                await self.vtn.call("DELETE", f"/subscriptions/{self.subscription_id}")
            except Exception as exc:  # going away either way
                log.info("subscription %s not deleted: %s", self.subscription_id, exc)
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
        if self.ven is None:
            await self._register()
        if self.subscription_id is None and self.settings.ven_callback_url:
            await self._try_subscribe()
        if self.settings.vtn_mqtt and not self.notifications.asked:
            await self.notifications.connect()
        await self.poll()
        await self._lift_safe_mode()
        await self.notifications.follow(set(self.programs))
        self.reachable = True
        await self.reports.send_undelivered()
        await self._until_next_poll()

    async def _lost(self, exc: BaseException, delay_s: float) -> None:
        self.reachable = False
        log.warning("VTN: %s; the stored events run on; retrying in %g s", exc, delay_s)
        await self._hold_safe_mode()

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

    # --- the VEN's objects on the VTN -----------------------------------------------------

    async def _register(self) -> None:
        """Find this VEN's ven object by name, or create it; then its resources."""
        found = await self.vtn.list("/vens", {"venName": self.name})
        mine = [v for v in found if isinstance(v, dict) and v.get("venName") == self.name]
        raw = (
            mine[0]
            if mine
            else await self.vtn.call(
                "POST",
                "/vens",
                json=Ven.model_validate(
                    {"objectType": "VEN_VEN_REQUEST", "venName": self.name}
                ).wire(),
            )
        )
        ven = _own_ven(raw)
        assert ven.id is not None
        have = [
            valid(Resource, r, "resource")
            for r in await self.vtn.list("/resources", {"venID": ven.id})
        ]
        for name in _names(self.settings.ven_resources):
            if not any(r.resource_name == name for r in have):
                request = Resource.model_validate(
                    {"objectType": "VEN_RESOURCE_REQUEST", "resourceName": name, "venID": ven.id}
                )
                have.append(
                    valid(
                        Resource,
                        await self.vtn.call("POST", "/resources", json=request.wire()),
                        "resource",
                    )
                )
        self.ven, self.resources, self.reachable = ven, have, True
        log.info("registered with the VTN as ven %s (%s)", ven.id, self.name)

    async def _try_subscribe(self) -> None:
        """Subscribe; a VTN that refuses is polled meanwhile, and asked again after a wait
        that grows (`SUBSCRIBE_BACKOFF`; the reason logged when it changes)."""
        if self.clock.monotonic() < self._subscribe_at:
            return
        try:
            await self._subscribe()
            self._subscribe_error, self._subscribe_failures = None, 0
        except (VtnError, VtnAuthError) as exc:
            self._subscribe_failures += 1
            wait_s = SUBSCRIBE_BACKOFF.wait_s(self._subscribe_failures)
            self._subscribe_at = self.clock.monotonic() + wait_s
            if str(exc) != self._subscribe_error:
                log.warning(
                    "no webhook subscription (%s): polling every %g s meanwhile; asking "
                    "again in %g s, then less often",
                    exc,
                    self.settings.vtn_poll_s,
                    wait_s,
                )
            self._subscribe_error = str(exc)

    async def _delete_own_subscriptions(self) -> None:
        """Delete this VEN's subscriptions to its callback URL that the VTN holds (left by a
        refused attempt or a previous run). A VTN that does not list them is not asked."""
        try:
            listed = await self.vtn.list("/subscriptions", {"clientName": self.name})
        except VtnError as exc:
            log.info("the VTN's subscriptions not listed (%s): none deleted", exc)
            return
        for raw in listed:
            if not isinstance(raw, dict) or raw.get("clientName") != self.name:
                continue
            urls = {
                op.get("callbackUrl")
                for op in raw.get("objectOperations") or []
                if isinstance(op, dict)
            }
            if self.settings.ven_callback_url in urls and raw.get("id"):
                await self.vtn.call("DELETE", f"/subscriptions/{raw['id']}")
                log.info("deleted subscription %s, left on the VTN before this one", raw["id"])

    async def _subscribe(self) -> None:
        await self._delete_own_subscriptions()
        body = {
            "clientName": self.name,
            "objectOperations": [
                {
                    "objects": ["EVENT", "PROGRAM"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "callbackUrl": self.settings.ven_callback_url,
                    "bearerToken": self.callback_token,
                }
            ],
        }
        created = await self.vtn.call(
            "POST", "/subscriptions", json=Subscription.model_validate(body).wire()
        )
        self.subscription_id = str(created["id"]) if isinstance(created, dict) else None
        log.info("subscribed to event notifications at %s", self.settings.ven_callback_url)

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
                if not (event.id.startswith(f"{self.id_prefix}-") and gone) or self._fallback(
                    event
                ):
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

    # --- safe mode ---------------------------------------------------------------------------

    def _fallback(self, event: EventRow) -> bool:
        return event.id.startswith(f"{self.id_prefix}-{FALLBACK_PREFIX}")

    async def _hold_safe_mode(self) -> None:
        """The VTN unreachable longer than FLEXGATE_VTN_FALLBACK_AFTER_S: each program's
        fallback limit held, as an event of its own (again if it ended meanwhile)."""
        if not self.safe_mode.lost_contact(self.clock.monotonic()) or self._power is None:
            return
        live = {e.id for e in self.events.live()}
        for name, limit_kw in self.safe_mode.limits_kw().items():
            stored = self.events.external_id(fallback_id(name))
            if name in self.safe_mode.holding and self._held_on(stored, live):
                continue
            try:
                baseline, maximum = self._power.envelope()
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
        return stored in live and left_s > FALLBACK_RENEW_BEFORE_S

    async def _lift_safe_mode(self) -> None:
        """Contact again: every fallback limit held is lifted (one from before a restart too)."""
        self.safe_mode.unreachable_since = None
        self.safe_mode.holding.clear()
        for event in self.events.live():
            if not self._fallback(event):
                continue
            try:
                await self.events.cancel(event.id, "vtn")
            except ConflictError:  # it ended meanwhile
                continue
            log.info("safe mode: the VTN answers again: %s lifted", event.id)

    def _party(self) -> Party31:
        names = set(_names(self.settings.ven_groups))
        for obj in [self.ven, *self.resources]:
            if obj is not None:
                names |= set(obj.targets or [])
        names |= {r.resource_name for r in self.resources}
        return Party31(self.name, frozenset(names))

    # --- notifications ---------------------------------------------------------------------

    def router(self) -> APIRouter:
        """The callback the VTN posts notifications to (FLEXGATE_VEN_CALLBACK_URL)."""
        router = APIRouter()

        # The Definition's challenge is `GET <callbackUrl>?echo=`; the Alliance's reference VTN
        # asks `GET <callbackUrl>/echo?echo=`. Only the value comes back, so no token is asked.
        @router.get(CALLBACK_PATH, include_in_schema=False)
        @router.get(f"{CALLBACK_PATH}/echo", include_in_schema=False)
        async def echo(echo: str = "") -> PlainTextResponse:
            if not echo:
                return PlainTextResponse("no echo challenge given", status_code=400)
            return PlainTextResponse(echo)

        @router.post(CALLBACK_PATH, include_in_schema=False)
        async def notification(request: Request) -> JSONResponse:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.callback_token}".encode()):
                return JSONResponse(
                    {"detail": "a notification needs the subscription's bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            try:
                note = Notification.model_validate(await request.json())
            except ValueError as exc:  # ValidationError and bad JSON
                return self._malformed(f"not an OpenADR 3.1 notification: {_why_malformed(exc)}")
            try:
                self._inbox.put_nowait(note)
            except asyncio.QueueFull:
                return JSONResponse(
                    {"detail": "too many notifications waiting: the next poll reads it"},
                    status_code=503,
                    headers={"Retry-After": "5"},
                )
            return JSONResponse({"detail": "received"})

        return router

    def _malformed(self, why: str) -> JSONResponse:
        """Refused, and said once per reason: the VTN may send every notification so. A
        notification says something changed: polling reads it now."""
        if why not in self._malformed_said:
            self._malformed_said.add(why)
            log.warning("a notification refused (%s); polling reads what it was about", why)
        self._poll_now.set()
        return JSONResponse({"detail": why}, status_code=400)

    async def _work_inbox(self) -> None:
        """Act on the notifications answered, in the order they came."""
        while True:
            note = await self._inbox.get()
            try:
                if not await self.notified(note):
                    log.warning("a notified event could not be stored; the next poll reads it")
            except Exception:  # a bug must not end the inbox: say so, and go on
                log.exception("a notification could not be acted on")

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


def _own_ven(raw: Any) -> Ven:
    """The VEN's own ven object. Malformed targets (the reference VTN turns them into a list
    of lists each time its VEN is read) are left out, said in the log: the VEN then answers
    events for its name, groups and resources only, and never loops on registration."""
    try:
        return Ven.model_validate(raw)
    except ValidationError as exc:
        if not isinstance(raw, dict) or any(e["loc"][:1] != ("targets",) for e in exc.errors()):
            raise VtnError(f"the VTN's ven is not an OpenADR 3.1 ven: {first_error(exc)}") from None
        log.warning(
            "the VTN's ven object has malformed targets (%s): read without them",
            first_error(exc),
        )
        ven: Ven = valid(Ven, {k: v for k, v in raw.items() if k != "targets"}, "ven")
        return ven


def _why_malformed(exc: ValueError) -> str:
    """The reason, naming the reference VTN's double encoding (a JSON string of the JSON)."""
    if isinstance(exc, ValidationError):
        errors = exc.errors()
        if errors and not errors[0].get("loc") and isinstance(errors[0].get("input"), str):
            return "the body is a JSON string, not an object (JSON encoded twice?)"
        return first_error(exc)
    return "the body is not JSON"


def _modification_or_none(raw: Any) -> int:
    try:
        return modification_of(Event.model_validate(raw))
    except ValidationError:
        return -1


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]
