"""A request becomes an event: its row, before anything stores or arms it
(`gateway.services.events` does).

- **Manual** (`POST /v1/events`): refused when its start has no zone, it ends in the past, the
  fleet runs simulated GPUs outside the lab, or it asks more than `event_max_overreach` times
  what the site can shed now (unless forced); beyond what the site can shed, kept with the
  shortfall stated.
- **External** (a grid protocol's): opted in or out (`gateway.services.optpolicy`: the
  source's own verdict, the site's policy, then what the utility would count of its shed).
- **Failed**: an external event that could not be handled at all, opted out.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

from gateway.clock import Clock
from gateway.errors import InvalidRequestError
from gateway.services.grid import ExternalEvent, Interval
from gateway.services.intervals import stored_doc
from gateway.services.optpolicy import OptPolicy
from gateway.services.quotes import Quotes
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store.models import EventRow


class EventIntake:
    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock,
        power: SitePower,
        quotes: Quotes,
        policy: OptPolicy,
    ) -> None:
        self.settings, self.clock = settings, clock
        self.power, self.quotes, self.policy = power, quotes, policy

    async def manual(
        self, *, reduction_kw: float, start: datetime, duration_s: float, source: str, force: bool
    ) -> EventRow:
        """A manual event, pending; refused (nothing to store) as the module's docstring says."""
        end, now = start + timedelta(seconds=duration_s), self.clock.now()
        _check_window(reduction_kw, start, end, now)
        most_kw = self._most_kw(reduction_kw, duration_s, force)
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
        return EventRow(
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

    def _most_kw(self, reduction_kw: float, duration_s: float, force: bool) -> float:
        """What the site can shed now over the event [kW]; refused when the plan would rest on
        simulated GPUs, or (unless `force`) the request is far beyond it."""
        simulated = self.power.fleet.simulated_refusal()
        if simulated:
            raise InvalidRequestError(f"no plan may rest on simulated GPUs here: {simulated}")
        most_kw: float = self.quotes.firm(duration_s, self.settings.opt_confidence)["achievable_kw"]
        overreach = self.settings.event_max_overreach
        # Nothing to compare with while the site can shed nothing (no agent reports yet).
        if not force and most_kw > 0 and reduction_kw > overreach * most_kw:
            raise InvalidRequestError(
                f"reduction_kw: {reduction_kw:g} kW is {reduction_kw / most_kw:.0f} times what "
                f"the site can shed now ({most_kw:.1f} kW; refused above "
                f"FLEXGATE_EVENT_MAX_OVERREACH={overreach:g} times): watts typed as kW? Send "
                '"force": true to store it anyway'
            )
        return most_kw

    async def external(self, external: ExternalEvent, event_id: str, source: str) -> EventRow:
        """An external event, pending when opted in, else opted out with the reason."""
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
        return EventRow(
            id=event_id,
            source=source,
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

    def failed(self, external_id: str, event_id: str, source: str, reason: str) -> EventRow:
        """An external event that could not be handled at all: failed, opted out."""
        now = self.clock.now()
        return EventRow(
            id=event_id,
            source=source,
            status="failed",
            start=now,
            end=now,
            reduction_kw=0.0,
            intervals=[],
            opt="out",
            reason=reason,
            external_id=external_id,
            created_at=now,
        )


def _check_window(reduction_kw: float, start: datetime, end: datetime, now: datetime) -> None:
    """Refuse a manual event whose start has no zone, that sheds nothing, or that would end in
    the past."""
    if start.tzinfo is None:
        raise InvalidRequestError("start: give a time zone (e.g. 2026-11-29T16:00:00Z)")
    if not (math.isfinite(reduction_kw) and reduction_kw > 0):
        raise InvalidRequestError("reduction_kw must be a positive number")
    if end <= now:
        raise InvalidRequestError(f"the event would end at {end.isoformat()}, in the past")
