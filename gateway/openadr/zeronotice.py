"""An OpenADR event with zero notice as a fast trigger (docs/fast.md, "OpenADR events with
zero notice").

Both VENs (2.0b and 3.1) read an event into the core's `ExternalEvent` and hand it to
`ZeroNotice.accept` in place of `Events.accept`. It goes **through the fast path** when all of
these hold, else **the ordinary way** (stored, planned, dispatched) exactly as before:

- the fast path is on (FLEXGATE_FAST_DEPTHS) and FLEXGATE_FAST_OPENADR is true;
- the event is acted on: not a test event, not a cancellation, no opt-out reason;
- **zero notice**: it starts at or before its receipt plus FLEXGATE_FAST_OPENADR_MAX_NOTICE_S
  (a clock's skew, a VTN's rounding), and is still running;
- **one step**: a single interval once its signals are merged (no ramp-up, no schedule of
  changing targets), ending within an hour of its receipt (a fast trigger's longest lease);
- **a reduction, not a level**: a share of the site (2.0b SIMPLE and LOAD_CONTROL
  `x-loadControlPercentOffset`; 3.1 SIMPLE and CONTROL_SETPOINT in PERCENT) read as that
  percentage, or a change in kW (2.0b LOAD_DISPATCH `delta`; 3.1 CONTROL_SETPOINT in KW) as
  a percentage of the site's uncapped facility power (the armed depths' own basis). Levels
  (setpoints, capacities, import limits) are targets the site loop holds against the meter,
  never a fixed step: they go the ordinary way;
- **an armed depth** within FLEXGATE_FAST_OPENADR_DEPTH_TOLERANCE_PCT percentage points of
  that percentage (the nearest, when two are).

It is then fired as the fast path's own trigger (signed, one message to every agent) for the
rest of the event, and recorded as a fast event naming the OpenADR event (`external_id`, and
in its reason); the VEN opts in. A fast event has no early end: a later cancellation of the
OpenADR event does not undo the caps before their lease ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from gateway.clock import Clock
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.grid import ExternalEvent
from gateway.settings import GatewaySettings
from gateway.store.models import as_utc

log = logging.getLogger("flexgate.ven")
#: A fast trigger's longest lease [s] (`agents.protocol_fast.FastTrigger.duration_s`).
MAX_FAST_S = 3600.0


@dataclass(frozen=True)
class Match:
    """An event the fast path takes: the armed depth, for how long, and why."""

    depth_pct: float
    duration_s: float
    asked_pct: float  #: what the event asks, percent of the site
    cause: str


@dataclass(frozen=True)
class Answer:
    opt: str  #: in or out
    reason: str | None
    fast_event_id: str | None = None  #: the fast event it fired or renewed


def match(
    external: ExternalEvent,
    received: datetime,
    depths_pct: tuple[float, ...],
    site_kw: float,
    *,
    max_notice_s: float,
    tolerance_pct: float,
) -> Match | None:
    """The armed depth a zero-notice event asks for, or None: it goes the ordinary way."""
    if external.test or external.opt_out_reason or external.status == "cancelled":
        return None
    if len(external.intervals) != 1 or not depths_pct:
        return None
    (interval,) = external.intervals
    notice_s = (as_utc(interval.start) - as_utc(received)).total_seconds()
    duration_s = (as_utc(interval.end) - as_utc(received)).total_seconds()
    if notice_s > max_notice_s or not 0.0 < duration_s <= MAX_FAST_S:
        return None
    if interval.level_kw is not None:
        return None
    if interval.baseline_share is not None:
        asked_pct = 100.0 * interval.baseline_share
        asked = f"{asked_pct:g}% of the site"
    elif site_kw > 0.0:
        asked_pct = 100.0 * interval.reduction_kw / site_kw
        asked = f"{interval.reduction_kw:g} kW ({asked_pct:.1f}% of the site's {site_kw:.0f} kW)"
    else:
        return None
    depth = min(depths_pct, key=lambda d: (abs(d - asked_pct), d))
    if abs(depth - asked_pct) > tolerance_pct:
        return None
    cause = (
        f"OpenADR event {external.event_id} with zero notice (starts "
        f"{as_utc(interval.start).isoformat()}, received {as_utc(received).isoformat()}) asks "
        f"{asked}"
    )
    return Match(depth, duration_s, asked_pct, cause)


class ZeroNotice:
    """`Events.accept`, with zero-notice events that match an armed depth fired through the
    fast path first (`match`)."""

    def __init__(
        self, settings: GatewaySettings, clock: Clock, events: Events, fast: FastPath | None
    ) -> None:
        self.settings, self.clock, self.events, self.fast = settings, clock, events, fast
        self.fired = 0  #: OpenADR events fired through the fast path since start

    def matching(self, external: ExternalEvent) -> Match | None:
        fast, settings = self.fast, self.settings
        if fast is None or not fast.enabled or not settings.fast_openadr:
            return None
        return match(
            external,
            self.clock.now(),
            fast.depths,
            fast.site_kw(),
            max_notice_s=settings.fast_openadr_max_notice_s,
            tolerance_pct=settings.fast_openadr_depth_tolerance_pct,
        )

    async def accept(self, external: ExternalEvent) -> Answer:
        """Fired through the fast path when it matches; else stored and acted on the
        ordinary way (`Events.accept`). A trigger the broker cannot take goes the ordinary
        way too: the event is not lost."""
        found = self.matching(external)
        if found is not None:
            assert self.fast is not None
            try:
                answer = await self.fast.trigger(
                    found.depth_pct,
                    found.duration_s,
                    cause=found.cause,
                    external_id=external.event_id,
                )
            except Exception as exc:  # the ordinary path still has the event
                log.warning(
                    "event %s: the fast trigger failed (%s); acted on the ordinary way",
                    external.event_id,
                    exc,
                )
            else:
                self.fired += 1
                log.info(
                    "event %s: zero notice at %g%%: fired through the fast path (%s)",
                    external.event_id,
                    found.depth_pct,
                    answer["event_id"],
                )
                return Answer("in", None, answer["event_id"])
        opt, reason = await self.events.accept(external)
        return Answer(opt, reason)
