"""The OpenADR 2.0b VEN (openleadr's client), feeding the gateway's events.

Registers with the VTN (retrying with backoff while it is unreachable) and polls at the
frequency the VTN asks for (openleadr's `show_fingerprint=False`: nothing printed). Every event
is read into an `ExternalEvent` (`signals`), **stored, then answered** (`Events.accept`): opt
in or out with the reason. This handler is the one place that catches everything: a failure
is logged, stored as a failed event and answered with an opt-out.

Also here: implied cancellation (an event the VTN stops listing), target filtering, the
TELEMETRY_USAGE report, the settlement report under the program's rule (`settled20`) and the
opt-out sent when the site cancels an OpenADR event (docs/openadr.md). `start` installs the
hardened XML parser (`xml`) before anything is parsed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from openleadr import OpenADRClient, enums, objects, utils

from gateway.clock import Clock, SystemClock
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.settled20 import BUFFER, SETTLED_ID, SETTLED_VALUES, SettledUsage
from gateway.openadr.signals import Party, SiteLoad, read_event
from gateway.openadr.xml import harden_parser
from gateway.openadr.zeronotice import ZeroNotice
from gateway.retries import VTN_BACKOFF
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow

log = logging.getLogger("flexgate.ven")

#: The largest VTN reply read. OpenADR messages are kilobytes; openleadr would read any size.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The TELEMETRY_USAGE report offered to the VTN: one rID per value of `GET /v1/site`, in kW.
REPORT_ID = "flexgate-site-usage"
REPORT_VALUES = {
    "facility_kw": "facility_power_kw",
    "gpu_kw": "gpu_power_kw",
    "shed_kw": "shed_facility_kw",
}
#: How often a report value may be sampled: the VTN picks its granularity in this range.
SAMPLING = objects.SamplingRate(
    min_period=timedelta(seconds=1), max_period=timedelta(hours=1), on_change=False
)


class MessageTooLargeError(Exception):
    pass


class BoundedResponse(aiohttp.ClientResponse):
    """A VTN reply, read only up to MAX_MESSAGE_BYTES: a larger one is refused unread."""

    async def read(self) -> bytes:
        if self.content_length is not None and self.content_length > MAX_MESSAGE_BYTES:
            self.close()
            raise MessageTooLargeError(f"{self.content_length} bytes exceeds {MAX_MESSAGE_BYTES}")
        body = bytearray()
        async for chunk in self.content.iter_any():
            body += chunk
            if len(body) > MAX_MESSAGE_BYTES:
                self.close()
                raise MessageTooLargeError(f"the reply exceeds {MAX_MESSAGE_BYTES} bytes")
        return bytes(body)


class Client(OpenADRClient):
    """openleadr's client whose VTN replies are bounded (openleadr reads each one whole and
    logs a refused one as a request error, dropping it), whose requests go through the
    given aiohttp trace configs (openleadr makes its session itself), and whose reports each
    send their own values."""

    trace_configs: tuple[aiohttp.TraceConfig, ...] = ()

    async def update_report(self, report_request_id: str) -> None:
        """openleadr's, reading only the request's own rIDs: openleadr gives every request
        of one oadrCreateReport the same list, all of their rIDs together."""
        request = utils.find_by(self.report_requests, "report_request_id", report_request_id)
        if request:
            specifier = request["report_specifier_id"]
            request["r_ids"] = [
                r for r in request["r_ids"] if (specifier, r) in self.report_callbacks
            ]
        await super().update_report(report_request_id)

    async def _ensure_client_session(self) -> None:
        fresh = not self.client_session
        await super()._ensure_client_session()
        self.client_session._response_class = BoundedResponse
        if fresh:
            for trace in self.trace_configs:
                trace.freeze()
                self.client_session._trace_configs.append(trace)


class Ven:
    """The grid protocol `openadr`: events `oadr-<eventID>` (`GridProtocol`)."""

    source = "openadr"
    id_prefix = "oadr"

    def __init__(
        self,
        settings: GatewaySettings,
        trace_configs: tuple[aiohttp.TraceConfig, ...] = (),
        clock: Clock | None = None,
    ) -> None:
        self.settings, self.clock = settings, clock or SystemClock()
        self.registered = False
        self.client = Client(
            ven_name=settings.ven_name,
            vtn_url=settings.vtn_url,
            show_fingerprint=False,
            vtn_fingerprint=settings.vtn_fingerprint,
            cert=str(settings.ven_cert) if settings.ven_cert else None,
            key=str(settings.ven_key) if settings.ven_key else None,
        )
        self.client.trace_configs = trace_configs
        self.client.add_handler("on_event", self.on_event)
        self.client.add_handler("on_update_event", self.on_event)
        self.client.add_hook("after_parse_xml", self.after_parse)
        # A copy: openleadr writes the scale onto the measurement it is given.
        kilowatts = dataclasses.replace(enums.MEASUREMENTS.REAL_POWER)
        for r_id in REPORT_VALUES:
            self.client.add_report(
                callback=functools.partial(self.reading, r_id),
                resource_id=r_id,
                measurement=kilowatts,
                scale="k",
                report_specifier_id=REPORT_ID,
                r_id=r_id,
                sampling_rate=SAMPLING,
                report_duration=timedelta(hours=1),  # the buffer the VTN may ask back over
            )
        if settings.report_baseline:
            self._offer_settled()
        self._site: tuple[float, dict[str, Any]] | None = None
        self._settled: SettledUsage | None = None
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._events: Events | None = None
        self._power: SitePower | None = None
        self._zero_notice: ZeroNotice | None = None

    def _offer_settled(self) -> None:
        """The settlement report (`settled20`): measured by the meter, or estimated without."""
        kilowatts = dataclasses.replace(enums.MEASUREMENTS.REAL_POWER)
        for r_id, (report_type, _) in SETTLED_VALUES.items():
            reading = enums.READING_TYPE.DERIVED  # the baseline, and the delta from it
            if r_id == "usage_kw":
                meter = bool(self.settings.meter_url)
                reading = enums.READING_TYPE.DIRECT_READ if meter else enums.READING_TYPE.ESTIMATED
            self.client.add_report(
                callback=functools.partial(self.settled, r_id),
                resource_id=r_id,
                measurement=kilowatts,
                scale="k",
                data_collection_mode="full",
                report_specifier_id=SETTLED_ID,
                r_id=r_id,
                report_type=report_type,
                reading_type=reading,
                sampling_rate=SAMPLING,
                report_duration=BUFFER,
            )

    @property
    def state(self) -> str:
        return "registered" if self.registered else "registering"

    async def start(
        self,
        events: Events,
        power: SitePower,
        baseline: ProgramBaseline | None = None,
        fast: FastPath | None = None,
    ) -> None:
        """Register and poll from now on, feeding `events` (zero-notice events matching an
        armed depth: `fast`, through `ZeroNotice`); `power` answers the usage report, the
        program's rule (`baseline`) the settlement report."""
        harden_parser()
        self._events, self._power = events, power
        self._zero_notice = ZeroNotice(self.settings, self.clock, events, fast)
        if baseline is not None:
            self._settled = SettledUsage(baseline, events, self.id_prefix)
        self._task = asyncio.create_task(self._register())

    @property
    def events(self) -> Events:
        assert self._events is not None, "the VEN has not been started"
        return self._events

    async def _register(self) -> None:
        """Registered with the VTN, asked again with backoff while it does not answer."""
        await VTN_BACKOFF.call(self.clock, self._try_register, on=(_NotRegisteredError,))
        self.registered = True

    async def _try_register(self) -> None:
        try:
            await self.client.run()
        except Exception as exc:  # the VTN may be down: keep trying, say so
            log.warning("VTN registration failed: %s", exc)
        if self.client.registration_id:
            return
        # openleadr closes its HTTP session when registration fails and would reuse the
        # closed one on the next try: drop it so the next attempt opens a new one.
        session = self.client.client_session
        if session is not None and session.closed:
            self.client.client_session = None
        raise _NotRegisteredError

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.client.registration_id:
            await self.client.stop()
        session = self.client.client_session
        if session is not None and not session.closed:  # never registered: openleadr keeps it
            await session.close()

    async def reading(self, r_id: str) -> float:
        """One TELEMETRY_USAGE value: the site as `GET /v1/site` shows it, read once per sample."""
        now = time.monotonic()
        if self._site is None or now - self._site[0] > 0.5:
            assert self._power is not None
            self._site = (now, await self._power.doc())
        return round(float(self._site[1][REPORT_VALUES[r_id]]), 3)

    async def settled(
        self, r_id: str, date_from: datetime, date_to: datetime, sampling_interval: timedelta
    ) -> list[tuple[datetime, float]]:
        """The settlement report's values (`settled20`); none before the VEN has started."""
        if self._settled is None:
            return []
        return await self._settled.values(r_id, date_from, date_to, sampling_interval)

    async def opt_out(self, event: EventRow) -> None:
        """oadrCreatedEvent optOut for an event cancelled on the site; repeated if re-sent."""
        assert event.external_id is not None
        await self.client.created_event(
            request_id=uuid.uuid4().hex,
            event_id=event.external_id,
            opt_type="optOut",
            modification_number=event.modification,
        )
        self.client.responded_events[event.external_id] = "optOut"

    async def after_parse(self, kind: str, payload: dict[str, Any]) -> None:
        """Implied cancellation: a distribute lists every event the VTN still holds for us."""
        if kind != "oadrDistributeEvent":
            return
        events = payload.get("events") or []  # an empty distribute cancels every event
        listed = {str(e.get("event_descriptor", {}).get("event_id")) for e in events}
        for event_id in await self.events.cancel_unlisted(listed):
            log.info("event %s: no longer listed by the VTN, cancelled", event_id)

    async def on_event(self, event: dict[str, Any]) -> str:
        """openleadr's handler: store, act, answer optIn or optOut."""
        event_id = str(event.get("event_descriptor", {}).get("event_id"))
        try:
            assert self._power is not None
            baseline, maximum = self._power.envelope()
            site = SiteLoad(baseline_facility_kw=baseline, max_capacity_kw=maximum)
            assert self._zero_notice is not None
            answer = await self._zero_notice.accept(
                read_event(event, site, self._rng, self._party())
            )
            if answer.reason:
                log.info("event %s: opt %s (%s)", event_id, answer.opt, answer.reason)
            return "optIn" if answer.opt == "in" else "optOut"
        except Exception as exc:  # the one place that catches everything
            log.exception("event %s could not be handled", event_id)
            self.events.refuse(event_id, f"{type(exc).__name__}: {exc}")
            return "optOut"

    def _party(self) -> Party:
        settings = self.settings

        def names(text: str) -> frozenset[str]:
            return frozenset(n.strip() for n in text.split(",") if n.strip())

        return Party(self.client.ven_id, names(settings.ven_groups), names(settings.ven_resources))


class _NotRegisteredError(Exception):
    """The VTN did not register this VEN (yet)."""
