"""Sending the 3.1 VEN's reports (`reports31` builds them): an event's interval reports, each
at its interval's end, and one-off reports; a report the VTN cannot take now is kept (the
newest `UNDELIVERED_KEPT`) and sent again after the next poll. With the program's rule
(`baseline`, `programbaseline`), an interval's facility figures are its settlement's; a figure
it cannot give is left out of the report, and why is logged."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from gateway.clock import Clock
from gateway.openadr.oadr31 import Event, ReportDescriptor
from gateway.openadr.oauth import VtnAuthError
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.reports31 import REPORTED, interval_report
from gateway.openadr.signals31 import periods
from gateway.openadr.vtn31 import VtnClient, VtnError
from gateway.services.site import SitePower

log = logging.getLogger("flexgate.ven31")

UNDELIVERED_KEPT = 100  #: reports kept for the VTN while it cannot take them


class Reporter:
    def __init__(self, vtn: VtnClient, clock: Clock, client_name: str) -> None:
        self.vtn, self.clock, self.client_name = vtn, clock, client_name
        self._reporting: dict[str, asyncio.Task[None]] = {}  #: event id -> its reports' task
        self._undelivered: list[dict[str, Any]] = []
        #: the program's rule the facility figures follow; None: the site's own figures
        self.baseline: ProgramBaseline | None = None

    def schedule(self, event: Event, offset_s: float, power: SitePower, stored_id: str) -> None:
        """Report each of the event's intervals at its end, as its reportDescriptors ask
        (`stored_id`: the event as the site stores it, for its settlement)."""
        asked = [d for d in event.report_descriptors or [] if d.payload_type in REPORTED]
        self.stop(str(event.id))
        if not asked:
            return
        windows = periods(event, self.clock.now(), timedelta(seconds=offset_s))
        self._reporting[str(event.id)] = asyncio.create_task(
            self._each_interval(event, asked, windows, power, stored_id)
        )

    async def _each_interval(
        self,
        event: Event,
        asked: list[ReportDescriptor],
        windows: list[Any],
        power: SitePower,
        stored_id: str,
    ) -> None:
        for begin, end, interval in windows:
            wait_s = (end - self.clock.now()).total_seconds()
            if wait_s < 0:
                continue
            await self.clock.sleep(wait_s)
            site = await power.doc()
            settled = None
            if self.baseline is not None:
                settled = await self.baseline.over(stored_id, begin, end)
                if settled.reason:
                    log.warning(
                        "event %s interval %s: reported without what %s cannot give: %s",
                        event.id,
                        interval.id,
                        self.baseline.rule,
                        settled.reason,
                    )
            report = interval_report(
                event, self.client_name, asked, interval.id, begin, end, site, settled
            )
            await self.post(report)

    def stop(self, event_id: str) -> None:
        """No more interval reports for this event."""
        task = self._reporting.pop(event_id, None)
        if task is not None:
            task.cancel()

    def stop_all(self) -> None:
        for event_id in list(self._reporting):
            self.stop(event_id)

    async def post(self, report: dict[str, Any] | None) -> None:
        """Send a report; one the VTN cannot take now is kept and sent after the next poll."""
        if report is None:
            return
        try:
            await self.vtn.call("POST", "/reports", json=report)
        except (VtnError, VtnAuthError) as exc:
            log.warning("report for event %s not delivered yet: %s", report.get("eventID"), exc)
            self._undelivered = [*self._undelivered, report][-UNDELIVERED_KEPT:]

    async def send_undelivered(self) -> None:
        waiting, self._undelivered = self._undelivered, []
        for report in waiting:
            await self.post(report)
