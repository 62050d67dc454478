"""The OpenADR 3.1 VEN: a REST client of the VTN, feeding the gateway's events.

`FLEXGATE_OPENADR=3.1`. With an OAuth2 token (`oauth`), it finds or creates its ven object
(`venName` = FLEXGATE_VEN_NAME) and its resources (FLEXGATE_VEN_RESOURCES), subscribes to event
notifications when FLEXGATE_VEN_CALLBACK_URL is set (the gateway serves the callback, `router`:
a notification must carry the subscription's bearer token), and reads programs and events every
FLEXGATE_VTN_POLL_S whatever the webhook does (the fallback, and the check on what it missed).
When the VTN's `GET /notifiers` offers MQTT (and FLEXGATE_VTN_MQTT is on), it also connects to
the broker (`mqtt31`) and follows the event topics of each program it reads
(`GET /notifiers/mqtt/topics/programs/{programID}/events`); a message is read exactly as a
webhook notification is. Webhook and MQTT may both deliver an event: one already read (the same
modification) is not read again.

Every event is read into an `ExternalEvent` (`signals31`), **stored, then acted on**
(`Events.accept`); one not acted on, or refused, is logged and told to the VTN in a report
(OpenADR 3 has no opt message: an OPERATING_STATE `RUNNING_OPTED_OUT` report whose reportName
carries the reason). An event the VTN deletes, or stops listing, is cancelled. An event the
VTN modifies (a new modificationDateTime) is read again. While the VTN is unreachable, the VEN
retries with backoff and the stored events run on: each ends at its own end.

Reports (`reports31`): at the end of each interval of an event acted on whose reportDescriptors
ask for DEMAND, USAGE, BASELINE or DELTA_USAGE, the site's facility and GPU figures.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import random
import secrets
from datetime import timedelta
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from gateway.clock import Clock
from gateway.errors import ConflictError
from gateway.openadr.mqtt31 import Credentials, MqttNotifications, broker_problem
from gateway.openadr.oadr31 import (
    Event,
    MqttBinding,
    Notification,
    Notifiers,
    Program,
    Resource,
    Subscription,
    Topics,
    Ven,
    crud,
    first_error,
)
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.reports31 import REPORTED, interval_report, refusal_report
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import (
    Party31,
    RefusedEventError,
    modification_of,
    periods,
    read_event31,
)
from gateway.services.events import Events
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow

log = logging.getLogger("flexgate.ven31")

RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: The path the gateway serves the VTN's notifications on.
CALLBACK_PATH = "/openadr3/notifications"
PAGE = 50  #: objects asked for per request (the VTN's `limit`)
UNDELIVERED_KEPT = 100  #: reports kept for the VTN while it cannot take them


class VtnError(Exception):
    """The VTN refused a request or could not be reached: the reason (and the HTTP status of a
    refusal)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


class Ven31:
    """The grid protocol `openadr` over OpenADR 3.1: events `oadr3-<event id>`."""

    source = "openadr"
    id_prefix = "oadr3"

    def __init__(
        self, settings: GatewaySettings, clock: Clock, http: httpx.AsyncClient | None = None
    ) -> None:
        self.settings, self.clock = settings, clock
        self.vtn = settings.vtn_url.rstrip("/")
        self.http = http or httpx.AsyncClient(timeout=settings.dispatch_timeout_s)
        self.tokens = TokenSource(
            self.http,
            clock,
            vtn_url=self.vtn,
            client_id=settings.vtn_client_id,
            client_secret=settings.vtn_client_secret,
            token_url=settings.vtn_token_url,
            allow_http=settings.lab or settings.vtn_allow_http,
        )
        #: The bearer token the VTN must present on the callback (the subscription's).
        self.callback_token = secrets.token_urlsafe(32)
        self.ven: Ven | None = None
        self.resources: list[Resource] = []
        self.subscription_id: str | None = None
        self._subscribe_error: str | None = None
        self.programs: dict[str, Program] = {}
        self.reachable = False
        self._handled: dict[str, int] = {}  #: event id -> the modification read
        self._read_at: dict[str, float] = {}  #: event id -> when it was last stored [s]
        self._reporting: dict[str, asyncio.Task[None]] = {}
        self._undelivered: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._events: Events | None = None
        self._power: SitePower | None = None
        self._lock = asyncio.Lock()
        self.mqtt: MqttNotifications | None = None
        self._mqtt_asked = False  #: GET /notifiers answered (MQTT used, or why not logged)
        self._followed: set[str] = set()  #: programs whose event topics MQTT follows
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
        self._stop_reports(event.external_id)
        await self._post_report(refusal_report(event.external_id, self.name, event.reason or ""))

    # --- life ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.settings.ven_name

    @property
    def events(self) -> Events:
        assert self._events is not None, "the VEN has not been started"
        return self._events

    async def start(self, events: Events, power: SitePower) -> None:
        self._events, self._power = events, power
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._reporting.values()]:
            if task is not None:
                task.cancel()
        if self.mqtt is not None:
            await self.mqtt.stop()
        if self.subscription_id is not None:
            try:
                await self._call("DELETE", f"/subscriptions/{self.subscription_id}")
            except Exception as exc:  # going away either way
                log.info("subscription %s not deleted: %s", self.subscription_id, exc)
        await self.http.aclose()

    async def _run(self) -> None:
        attempt = 0
        while True:
            try:
                if self.ven is None:
                    await self._register()
                if self.subscription_id is None and self.settings.ven_callback_url:
                    await self._try_subscribe()
                if self.settings.vtn_mqtt and not self._mqtt_asked:
                    await self._try_mqtt()
                await self.poll()
                if self.mqtt is not None:
                    await self._follow_programs()
                self.reachable, attempt = True, 0
                await self._send_undelivered()
                await self._until_next_poll()
            except (VtnError, VtnAuthError) as exc:
                self.reachable = False
                delay = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                log.warning("VTN: %s; the stored events run on; retrying in %g s", exc, delay)
                attempt += 1
                await self.clock.sleep(delay)
            except Exception:  # a bug must not end the VEN: say so, and go on
                log.exception("the VEN's poll failed")
                attempt += 1
                await self.clock.sleep(RETRY_S[-1])

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

    # --- the VTN's REST API ----------------------------------------------------------------

    async def _call(
        self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """One request with a fresh token; a 401 fetches a new token and tries once more, and
        so does a connection the VTN closed as it was reused (a keep-alive race)."""
        for attempt in (1, 2):
            token = await self.tokens.token()
            try:
                answer = await self.http.request(
                    method,
                    f"{self.vtn}{path}",
                    json=json,
                    params=params,
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.HTTPError as exc:
                if attempt == 1 and isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError):
                    continue
                raise VtnError(f"{method} {path}: unreachable ({type(exc).__name__})") from None
            if answer.status_code == 401 and attempt == 1:
                self.tokens.invalidate()
                continue
            if answer.status_code >= 400:
                raise VtnError(
                    f"{method} {path}: HTTP {answer.status_code} {_detail(answer)}",
                    answer.status_code,
                )
            return answer.json() if answer.content else None
        raise AssertionError("unreachable")

    async def _list(self, path: str, params: dict[str, Any] | None = None) -> list[Any]:
        out: list[Any] = []
        while True:
            page = await self._call(
                "GET", path, params={**(params or {}), "skip": len(out), "limit": PAGE}
            )
            if not isinstance(page, list):
                raise VtnError(f"GET {path}: the answer is not a list")
            out += page
            if len(page) < PAGE:
                return out

    async def _register(self) -> None:
        """Find this VEN's ven object by name, or create it; then its resources."""
        found = await self._list("/vens", {"venName": self.name})
        mine = [v for v in found if isinstance(v, dict) and v.get("venName") == self.name]
        raw = (
            mine[0]
            if mine
            else await self._call(
                "POST",
                "/vens",
                json=Ven.model_validate(
                    {"objectType": "VEN_VEN_REQUEST", "venName": self.name}
                ).wire(),
            )
        )
        ven = _valid(Ven, raw, "ven")
        assert ven.id is not None
        have = [
            _valid(Resource, r, "resource")
            for r in await self._list("/resources", {"venID": ven.id})
        ]
        for name in _names(self.settings.ven_resources):
            if not any(r.resource_name == name for r in have):
                request = Resource.model_validate(
                    {"objectType": "VEN_RESOURCE_REQUEST", "resourceName": name, "venID": ven.id}
                )
                have.append(
                    _valid(
                        Resource,
                        await self._call("POST", "/resources", json=request.wire()),
                        "resource",
                    )
                )
        self.ven, self.resources, self.reachable = ven, have, True
        log.info("registered with the VTN as ven %s (%s)", ven.id, self.name)

    async def _try_subscribe(self) -> None:
        """Subscribe; a VTN that refuses is polled meanwhile, and asked again at each poll
        (the reason logged when it changes)."""
        try:
            await self._subscribe()
            self._subscribe_error = None
        except (VtnError, VtnAuthError) as exc:
            if str(exc) != self._subscribe_error:
                log.warning(
                    "no webhook subscription (%s): polling every %g s meanwhile",
                    exc,
                    self.settings.vtn_poll_s,
                )
            self._subscribe_error = str(exc)

    async def _subscribe(self) -> None:
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
        created = await self._call(
            "POST", "/subscriptions", json=Subscription.model_validate(body).wire()
        )
        self.subscription_id = str(created["id"]) if isinstance(created, dict) else None
        log.info("subscribed to event notifications at %s", self.settings.ven_callback_url)

    async def poll(self) -> None:
        """Read the programs and every event the VTN lists for this VEN; cancel those gone."""
        programs = {}
        for raw in await self._list("/programs"):
            try:
                program = Program.model_validate(raw)
            except ValidationError as exc:
                log.warning("a program is not a 3.1 program, skipped: %s", first_error(exc))
                continue
            if program.id:
                programs[program.id] = program
        self.programs = programs
        asked_at = self.clock.monotonic()
        listed = await self._list("/events")
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
                if not (event.id.startswith(f"{self.id_prefix}-") and gone):
                    continue
                self._stop_reports(str(event.external_id))
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
        opt, reason = await self.events.accept(external)
        self._handled[event.id] = modification  # stored: only a new modification is read again
        self._read_at[event.id] = self.clock.monotonic()
        if opt == "out":
            log.info("event %s: not acted on (%s)", event.id, reason)
            self._stop_reports(event.id)
            await self._post_report(refusal_report(event.id, self.name, reason or ""))
            return
        log.info("event %s: acted on", event.id)
        self._schedule_reports(event, external.start_offset_s)

    async def _refuse(self, event_id: str, reason: str) -> None:
        """Refused: logged, stored as failed (a stored version holds as it was), reported."""
        log.warning("event %s refused: %s", event_id, reason)
        self.events.refuse(event_id, reason)
        await self._post_report(refusal_report(event_id, self.name, reason))

    async def deleted(self, event_id: str) -> None:
        """The VTN deleted the event: it is cancelled (User Guide 7.9)."""
        self._handled.pop(event_id, None)
        self._stop_reports(event_id)
        stored = self.events.external_id(event_id)
        if any(e.id == stored for e in self.events.live()):
            try:
                await self.events.cancel(stored, "vtn")
            except ConflictError:  # it ended meanwhile
                return
            log.info("event %s: deleted by the VTN, cancelled", event_id)

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
                return JSONResponse(
                    {"detail": f"not an OpenADR 3.1 notification: {first_error(exc)}"},
                    status_code=400,
                )
            if not await self.notified(note):
                return JSONResponse(
                    {"detail": "the event could not be stored: send it again"},
                    status_code=503,
                    headers={"Retry-After": "5"},
                )
            return JSONResponse({"detail": "received"})

        return router

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

    # --- MQTT notifications ----------------------------------------------------------------

    async def _try_mqtt(self) -> None:
        """Read the VTN's notifiers once; connect to its MQTT broker when it offers one that
        may be used, else say why (webhook and polling go on)."""
        try:
            notifiers = Notifiers.model_validate(await self._call("GET", "/notifiers"))
        except ValidationError as exc:
            self._mqtt_asked = True
            log.warning("the VTN's notifiers are not 3.1 notifiers (%s): no MQTT", first_error(exc))
            return
        except VtnError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                self._mqtt_asked = True
                log.info("the VTN offers no notifiers (%s; a 3.0 VTN?): no MQTT", exc)
            else:  # the poll goes on either way
                log.warning("the VTN's notifiers not read (%s): asked again after a poll", exc)
            return
        self._mqtt_asked = True
        binding = notifiers.mqtt
        if binding is None:
            log.info("the VTN offers no MQTT notifier: webhook and polling only")
            return
        problems = []
        for uri in binding.uris:
            problem = broker_problem(
                uri, allow_plain=self.settings.lab or self.settings.vtn_allow_http
            )
            if problem is None:
                break
            problems.append(problem)
        else:
            log.warning("MQTT not used: %s; webhook and polling only", "; ".join(problems))
            return
        refused = _unsupported(binding, bool(self.settings.vtn_mqtt_username))
        if refused:
            log.warning("MQTT not used: %s; webhook and polling only", refused)
            return
        self.mqtt = MqttNotifications(
            uri,
            credentials=lambda: self._mqtt_credentials(binding),
            handler=self._mqtt_message,
            resubscribed=self._poll_soon,
        )
        self.mqtt.start()

    async def _mqtt_credentials(self, binding: MqttBinding) -> Credentials:
        """FLEXGATE_VTN_MQTT_USERNAME/_PASSWORD when set; else as the binding says."""
        if self.settings.vtn_mqtt_username:
            return (
                self.settings.vtn_mqtt_username,
                self.settings.vtn_mqtt_password.get_secret_value(),
            )
        auth = binding.authentication
        if auth.method == "OAUTH2_BEARER_TOKEN":
            username = auth.username or ""
            if username == "{clientID}":
                username = self.settings.vtn_client_id
            return username, await self.tokens.token()
        return None  # ANONYMOUS

    async def _follow_programs(self) -> None:
        """Follow the event topics of each program not followed yet; one the VTN cannot name
        now is asked for again after the next poll."""
        assert self.mqtt is not None
        for program_id in sorted(set(self.programs) - self._followed):
            path = f"/notifiers/mqtt/topics/programs/{program_id}/events"
            try:
                topics = Topics.model_validate(await self._call("GET", path))
            except ValidationError as exc:
                log.warning("GET %s: not 3.1 topics (%s)", path, first_error(exc))
                continue
            except (VtnError, VtnAuthError) as exc:
                log.warning("MQTT: program %s's event topics not known yet: %s", program_id, exc)
                continue
            names = topics.topics
            chosen = [names["ALL"]] if "ALL" in names else list(names.values())
            self.mqtt.follow(chosen)
            self._followed.add(program_id)

    async def _mqtt_message(self, topic: str, payload: bytes) -> None:
        """A message from the broker: a notification, read as the webhook reads one."""
        try:
            note = Notification.model_validate(json.loads(payload))
        except ValueError as exc:  # ValidationError and bad JSON (and bad UTF-8)
            why = first_error(exc) if isinstance(exc, ValidationError) else "not JSON"
            log.warning(
                "MQTT message on %s refused: not an OpenADR 3.1 notification: %s", topic, why
            )
            return
        if not await self.notified(note):
            log.warning(
                "MQTT message on %s: its event could not be stored; the poll reads it", topic
            )

    # --- reports ---------------------------------------------------------------------------

    def _schedule_reports(self, event: Event, offset_s: float) -> None:
        asked = [d for d in event.report_descriptors or [] if d.payload_type in REPORTED]
        self._stop_reports(str(event.id))
        if not asked:
            return
        windows = periods(event, self.clock.now(), timedelta(seconds=offset_s))
        self._reporting[str(event.id)] = asyncio.create_task(
            self._report_each_interval(event, asked, windows)
        )

    async def _report_each_interval(
        self, event: Event, asked: list[Any], windows: list[Any]
    ) -> None:
        assert self._power is not None
        for begin, end, interval in windows:
            wait_s = (end - self.clock.now()).total_seconds()
            if wait_s < 0:
                continue
            await self.clock.sleep(wait_s)
            site = await self._power.doc()
            await self._post_report(
                interval_report(event, self.name, asked, interval.id, begin, end, site)
            )

    def _stop_reports(self, event_id: str) -> None:
        task = self._reporting.pop(event_id, None)
        if task is not None:
            task.cancel()

    async def _post_report(self, report: dict[str, Any] | None) -> None:
        """Send a report; one the VTN cannot take now is kept and sent after the next poll."""
        if report is None:
            return
        try:
            await self._call("POST", "/reports", json=report)
        except (VtnError, VtnAuthError) as exc:
            log.warning("report for event %s not delivered yet: %s", report.get("eventID"), exc)
            self._undelivered = [*self._undelivered, report][-UNDELIVERED_KEPT:]

    async def _send_undelivered(self) -> None:
        waiting, self._undelivered = self._undelivered, []
        for report in waiting:
            await self._post_report(report)


def _unsupported(binding: MqttBinding, configured: bool) -> str | None:
    """Why the binding's authentication cannot be used, or None."""
    if binding.authentication.method == "CERTIFICATE" and not configured:
        return (
            "the broker asks for a client certificate (CERTIFICATE), which flexgate does not "
            "use; set FLEXGATE_VTN_MQTT_USERNAME/_PASSWORD if it takes those too"
        )
    return None


def _modification_or_none(raw: Any) -> int:
    try:
        return modification_of(Event.model_validate(raw))
    except ValidationError:
        return -1


def _valid(model: Any, raw: Any, what: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise VtnError(
            f"the VTN's {what} is not an OpenADR 3.1 {what}: {first_error(exc)}"
        ) from None


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _detail(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or "")
    return ""
