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

The programs and events, polled or notified, are read by `eventreader31`: every event into
an `ExternalEvent` (`signals31`), **stored, then acted on** (`Events.accept`); one not acted
on, or refused, is logged and told to the VTN in a report (OpenADR 3 has no opt message: an
OPERATING_STATE `RUNNING_OPTED_OUT` report whose reportName carries the reason). An event the
VTN deletes, or stops listing, is cancelled. An event the VTN modifies (a new
modificationDateTime) is read again. While the VTN is unreachable, the VEN retries with backoff
and the stored events run on: each ends at its own end.

Its requests go through `vtn31` (a fresh token each, lists by pages). Reports (`reports31`
builds them, `reporter31` sends them): at the end of each interval of an event acted on whose
reportDescriptors ask for DEMAND, USAGE, BASELINE or DELTA_USAGE, the site's facility and GPU
figures (the facility's from the event's settlement under `FLEXGATE_REPORT_BASELINE` if set).
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from gateway.clock import Clock
from gateway.openadr.eventreader31 import EventReader31
from gateway.openadr.fallback31 import Fallbacks31
from gateway.openadr.notifiers31 import MqttFollower
from gateway.openadr.oadr31 import Notification
from gateway.openadr.oauth import TokenSource, VtnAuthError
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.registration31 import Registration31
from gateway.openadr.reporter31 import Reporter
from gateway.openadr.reports31 import refusal_report
from gateway.openadr.safemode31 import SafeMode, is_fallback, parse_limits
from gateway.openadr.vtn31 import VtnClient, VtnError
from gateway.openadr.webhook31 import Webhook31
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
        self.reachable = False
        self._task: asyncio.Task[None] | None = None
        self._reader: EventReader31 | None = None
        self._fallbacks: Fallbacks31 | None = None

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
    def reader(self) -> EventReader31:
        assert self._reader is not None, "the VEN has not been started"
        return self._reader

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
        self._reader = EventReader31(
            self.settings,
            self.clock,
            self.vtn,
            self.registration,
            self.safe_mode,
            self.reports,
            events,
            power,
            fast,
            self.id_prefix,
        )
        self._fallbacks = Fallbacks31(self.safe_mode, self.clock, events, power, self.reader.lock)
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
        await self.reader.poll()
        await self.fallbacks.lift()
        await self.notifications.follow(set(self.reader.programs))
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

    # --- notifications ---------------------------------------------------------------------

    async def notified(self, note: Notification) -> bool:
        """Act on a notification; False when its event could not be stored. The webhook and
        MQTT are made before the reader, which the VEN makes when it starts."""
        return await self.reader.notified(note)
