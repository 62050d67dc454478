"""The 2.0b VEN's settlement report (docs/openadr.md, "Reports under the program's baseline"):
the program's baseline and the metered usage of the VTN's events, per settlement interval.

Offered beside TELEMETRY_USAGE when `FLEXGATE_REPORT_BASELINE` names a rule, as the
TELEMETRY_USAGE report `SETTLED_ID` with one rID per figure (`SETTLED_VALUES`): the rule's
baseline (reportType `baseline`), the metered load (`usage`) and the metered less the baseline
(`deltaUsage`, negative when the site sheds), all real power in kW. openleadr asks for them at
each report ("full" collection, `values`): every settlement interval of an event of the VTN
the site acted on that has closed within `BUFFER` before the report, not sent yet, each at
its start. A figure the rule or the history cannot give is not sent (why is logged once); it
is sent at a later report if it becomes known within `BUFFER`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from openleadr import enums

from gateway.openadr.programbaseline import Figures, ProgramBaseline
from gateway.services.events import Events
from gateway.store.models import as_utc

log = logging.getLogger("flexgate.ven")

SETTLED_ID = "flexgate-settlement"
#: rID -> its 2.0b reportType and the figure it reports [kW]
SETTLED_VALUES: dict[str, tuple[str, Callable[[Figures], float | None]]] = {
    "baseline_kw": (enums.REPORT_TYPE.BASELINE, lambda f: f.baseline_kw),
    "usage_kw": (enums.REPORT_TYPE.USAGE, lambda f: f.metered_kw),
    "delta_kw": (enums.REPORT_TYPE.DELTA_USAGE, lambda f: f.delta_kw),
}
#: How far back a report looks for closed intervals not sent yet.
BUFFER = timedelta(hours=1)


class SettledUsage:
    """The settlement report's values for the events whose ids start `<prefix>-`."""

    def __init__(self, baseline: ProgramBaseline, events: Events, prefix: str) -> None:
        self.baseline, self.events, self.prefix = baseline, events, prefix
        self._sent: dict[str, dict[tuple[str, datetime], datetime]] = {}  #: rID -> sent -> end
        self._closed: tuple[datetime, list[tuple[str, Figures]]] | None = None
        self._said: set[tuple[str, str]] = set()  #: (event id, reason) logged

    async def values(
        self, r_id: str, date_from: datetime, date_to: datetime, sampling_interval: Any
    ) -> list[tuple[datetime, float]]:
        """openleadr's callback: the rID's values not sent yet, up to `date_to`."""
        _, figure = SETTLED_VALUES[r_id]
        sent = self._sent.setdefault(r_id, {})
        out = []
        for event_id, figures in await self._closed_by(date_to):
            value = figure(figures)
            key = (event_id, figures.start)
            if value is None or key in sent:
                continue
            sent[key] = figures.end
            out.append((figures.start, round(value, 3)))
        for key, end in list(sent.items()):
            if end <= date_to - BUFFER:
                del sent[key]
        return out

    async def _closed_by(self, date_to: datetime) -> list[tuple[str, Figures]]:
        """The settlement intervals closed within BUFFER before `date_to`, read once per
        settlement interval (a report may come every second)."""
        step_s = self.baseline.interval_min * 60
        boundary = datetime.fromtimestamp(date_to.timestamp() // step_s * step_s, UTC)
        if self._closed is not None and self._closed[0] == boundary:
            return self._closed[1]
        since = boundary - BUFFER
        closed = []
        for event in self.events.all():
            mine = event.id.startswith(f"{self.prefix}-") and event.opt == "in" and not event.test
            if not mine or as_utc(event.end) <= since or as_utc(event.start) >= boundary:
                continue
            for figures in await self.baseline.intervals(event.id):
                if since < figures.end <= boundary:
                    closed.append((event.id, figures))
                    self._say(event.id, figures.reason)
        self._closed = (boundary, closed)
        return closed

    def _say(self, event_id: str, reason: str | None) -> None:
        if reason and (event_id, reason) not in self._said:
            self._said.add((event_id, reason))
            log.warning(
                "event %s: settlement report without what %s cannot give: %s",
                event_id,
                self.baseline.rule,
                reason,
            )
