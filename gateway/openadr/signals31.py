"""OpenADR 3.1 events -> facility-level reductions, interval by interval.

A pure function (`read_event31`) like the 2.0b one (`signals.read_event`), producing the same
`ExternalEvent` with the same kinds of target (`Interval`: a level to hold, a share of the
baseline, or a fixed reduction). A payload's **type** decides what it means, its units come
from the event's payloadDescriptors, else the program's, else kW:

- SIMPLE 0-3: `level_shares` of the baseline the event began with (0, 10, 25, 40%), as 2.0b;
- IMPORT_CAPACITY_LIMIT, IMPORT_CAPACITY_SUBSCRIPTION, DISPATCH_SETPOINT (KW): a facility
  level to hold (baseline - value, at least 0), re-evaluated as the load changes; the two
  capacities are ceilings (`Interval.ceiling`: held below, by the site loop's margin);
- CONTROL_SETPOINT in KW: a change from what the site would use: -value kW when negative (the
  User Guide's Example 8.9.3-2), more load (positive) is an opt-out; in PERCENT (-1 to 1):
  -value of the baseline;
- any other type (PRICE, GHG, EXPORT_*, alerts ...): not acted on, with the reason; an
  event left with nothing to act on is an opt-out with the reasons.

Timing (User Guide 7.3, 7.4): an interval's own intervalPeriod overrides the event's; an
interval without a start follows the one before; "0001-01-01" starts now; P9999Y (or the
event's duration when the last interval has none) is open-ended, scheduled for OPEN_ENDED
until the VTN changes or deletes the event; several values in one payload split the interval
into equal sub-intervals; `randomizeStart` shifts every start by one offset drawn uniformly
in [-r, +r]. Overlapping payloads: the strictest reduction holds in each time slice.

Refused, changing nothing: a negative duration or randomizeStart, an interval without a
period, a value that is not a number, a value out of the type's range, a unit that is not
power, an event whose targets name neither this VEN nor one of its resources or targets.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.openadr.oadr31 import (
    DO_IT_NOW,
    INFINITE,
    Event,
    EventPayloadDescriptor,
    Program,
)
from gateway.openadr.oadr31 import Interval as EventInterval
from gateway.openadr.signals import OPEN_ENDED, SiteLoad, _strictest
from gateway.services.grid import ExternalEvent, Interval

#: The payload types flexgate turns into a facility level [kW].
LEVEL_TYPES = ("IMPORT_CAPACITY_LIMIT", "IMPORT_CAPACITY_SUBSCRIPTION", "DISPATCH_SETPOINT")
#: Of those, the maxima (held below, judged over averaging intervals), not setpoints.
CEILING_TYPES = ("IMPORT_CAPACITY_LIMIT", "IMPORT_CAPACITY_SUBSCRIPTION")
ACTED_ON = ("SIMPLE", "CONTROL_SETPOINT", *LEVEL_TYPES)


class RefusedEventError(ValueError):
    """An event flexgate cannot read at all: the reason, and no cap changes."""


@dataclass(frozen=True)
class Party31:
    """Who this VEN is, for an event's targets: its venName, its resources' names and the
    targets the VTN granted it (its ven object's and the configured ones)."""

    ven_name: str
    names: frozenset[str] = frozenset()

    def untargeted_reason(self, event: Event) -> str | None:
        if not event.targets:
            return None
        if set(event.targets) & ({self.ven_name} | self.names):
            return None
        return f"not targeted at this VEN (targets: {', '.join(event.targets)})"


def modification_of(event: Event) -> int:
    """3.1 has no modification number: the VTN's modificationDateTime, in milliseconds."""
    stamp = event.modification_date_time or event.created_date_time
    return int(stamp.timestamp() * 1000) if stamp else 0


def read_event31(
    event: Event,
    site: SiteLoad,
    now: datetime,
    program: Program | None = None,
    rng: random.Random | None = None,
    party: Party31 | None = None,
) -> ExternalEvent:
    """The facility reductions a 3.1 event asks for, interval by interval.

    Raises `RefusedEventError` for an event whose timing or values cannot be read.
    """
    offset = _start_offset_s(event, rng)
    out = ExternalEvent(
        event_id=str(event.id),
        modification=modification_of(event),
        status="far",
        test=False,
        ramp_up_s=0.0,
        start_offset_s=offset,
    )
    if not event.intervals:
        raise RefusedEventError("the event has no intervals")
    pieces = _pieces(event, site, now, offset, _units_of(event, program), out)
    if party is not None and (elsewhere := party.untargeted_reason(event)):
        out.opt_out_reason = elsewhere
    live = [p for p in pieces if p.end > now]
    if out.opt_out_reason is None and not live:
        why = out.ignored or (["every interval has ended"] if pieces else ["none"])
        out.opt_out_reason = "no payload flexgate can act on: " + "; ".join(why)
    out.intervals = [] if out.opt_out_reason else _strictest(live)
    return out


def _start_offset_s(event: Event, rng: random.Random | None) -> float:
    """The one random shift of every start, drawn uniformly in [-r, +r] (randomizeStart)."""
    default = event.interval_period
    randomize = default.randomize_start if default and default.randomize_start else timedelta(0)
    if randomize < timedelta(0):
        raise RefusedEventError(f"randomizeStart {randomize} is negative")
    half = randomize.total_seconds()
    return (rng or random.Random()).uniform(-half, half) if half > 0 else 0.0


def _units_of(event: Event, program: Program | None) -> dict[str, str | None]:
    """Each payload type's units: the event's own descriptors win over the program's."""
    from_program = [
        d
        for d in (program.payload_descriptors or [] if program else [])
        if isinstance(d, EventPayloadDescriptor)
    ]
    return _units(from_program) | _units(event.payload_descriptors)


def _pieces(
    event: Event,
    site: SiteLoad,
    now: datetime,
    offset_s: float,
    units: dict[str, str | None],
    out: ExternalEvent,
) -> list[Interval]:
    """Each value's target over its share of its interval; the payloads and values not acted
    on are noted in `out` (`ignored`, and an opt-out's reason)."""
    pieces: list[Interval] = []
    for begin, end, interval in periods(event, now, timedelta(seconds=offset_s)):
        for payload in interval.payloads:
            label = f"interval {interval.id} {payload.type}"
            if payload.type not in ACTED_ON:
                out.ignored.append(f"{label}: not a payload flexgate acts on")
                continue
            values = payload.values
            if not values:
                raise RefusedEventError(f"{label}: no values")
            step = (end - begin) / len(values)
            for k, value in enumerate(values):
                target, reason = _target(payload.type, value, units.get(payload.type), site)
                if reason is not None:
                    if reason.startswith("refused: "):
                        raise RefusedEventError(f"{label}: {reason.removeprefix('refused: ')}")
                    out.ignored.append(f"{label}: {reason}")
                    if reason.startswith("opt out: "):
                        out.opt_out_reason = f"{label}: {reason.removeprefix('opt out: ')}"
                    continue
                assert target is not None
                pieces.append(_timed(target, begin + k * step, begin + (k + 1) * step))
    return pieces


def _units(descriptors: list[EventPayloadDescriptor] | None) -> dict[str, str | None]:
    """Each payload type's units."""
    return {d.payload_type: d.units for d in descriptors or []}


def periods(
    event: Event, now: datetime, offset: timedelta
) -> list[tuple[datetime, datetime, EventInterval]]:
    """Each interval's start and end, shifted by the random offset."""
    default = event.interval_period
    out: list[tuple[datetime, datetime, EventInterval]] = []
    cursor: datetime | None = None
    for i, interval in enumerate(event.intervals):
        own = interval.interval_period
        start = own.start if own and own.start else None
        if start is None and i == 0:
            start = default.start if default else None
        if start is None and cursor is not None:
            start = cursor
        if start is None:
            raise RefusedEventError(f"interval {interval.id}: no start (no intervalPeriod)")
        if start == DO_IT_NOW:
            start = cursor if cursor is not None and i > 0 else now
        length = own.duration if own and own.duration is not None else None
        if length is None:
            length = default.duration if default and default.duration is not None else None
        if length is None and event.duration is not None and i == len(event.intervals) - 1:
            length = event.duration
        if length is None:
            raise RefusedEventError(f"interval {interval.id}: no duration")
        if length < timedelta(0):
            raise RefusedEventError(f"interval {interval.id}: duration {length} is negative")
        if own and own.randomize_start and own.randomize_start < timedelta(0):
            raise RefusedEventError(f"interval {interval.id}: randomizeStart is negative")
        end = (max(start, now) + OPEN_ENDED) if length >= INFINITE else start + length
        cursor = end
        out.append((start + offset, end + offset, interval))
    return out


@dataclass(frozen=True)
class _Target:
    reduction_kw: float
    level_kw: float | None = None
    baseline_share: float | None = None
    ceiling: bool = False


def _target(
    kind: str, value: object, units: str | None, site: SiteLoad
) -> tuple[_Target | None, str | None]:
    """The target one value asks for, or why not ("refused: ", "opt out: ", or a note)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None, f"refused: {value!r} is not a number"
    v, base = float(value), site.baseline_facility_kw
    if kind == "SIMPLE":
        if value not in (0, 1, 2, 3):
            return None, f"refused: SIMPLE is a level 0 to 3, not {value!r}"
        share = site.level_shares[int(v)]
        return _Target(share * base, baseline_share=share), None
    if kind in LEVEL_TYPES:
        if units not in (None, "KW"):
            return None, f"refused: units {units}: a level is power (KW)"
        if v < 0:
            return None, f"refused: a level of {v:g} kW is negative"
        return _Target(max(base - v, 0.0), level_kw=v, ceiling=kind in CEILING_TYPES), None
    # CONTROL_SETPOINT: a change from normal operation
    if v > 0:
        return None, "opt out: asks for more load (a positive setpoint change)"
    if units in (None, "KW"):
        return _Target(-v), None
    if units == "PERCENT":
        if v < -1:
            return None, f"refused: PERCENT is -1 to 1, not {v:g}"
        return _Target(-v * base, baseline_share=-v), None
    return None, f"refused: units {units}: CONTROL_SETPOINT is read in KW or PERCENT"


def _timed(target: _Target, begin: datetime, end: datetime) -> Interval:
    return Interval(
        begin,
        end,
        target.reduction_kw,
        level_kw=target.level_kw,
        baseline_share=target.baseline_share,
        ceiling=target.ceiling,
    )
