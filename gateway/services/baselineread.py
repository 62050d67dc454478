"""A program rule's baseline read from the meter history: what settlement (after an event)
and the counted kW of a quote or an opt-in (before one) share.

`EventSpan` puts an event's [start, end) on the site's clock, rounded out to whole settlement
intervals, in one part per local day it covers; `read_history` reads the intervals the rules
look back over and folds them into the site's local days (`gateway.services.meterdays`), with
the other events' days left out; `rule_baseline` is one preset's baseline for the span, day
part by day part, or the reason there is none; `meter_level` a meter-before rule's level from
the raw samples before a moment.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlmodel import Session

from flexmodel.baselinedays import Baseline
from flexmodel.baselinerules import SameDayRule
from flexmodel.baselines import baseline, preset
from flexmodel.errors import FlexModelError
from flexmodel.localdays import Calendar, MeterDay
from flexmodel.meterbefore import MeterBeforeRule, meter_before
from gateway.services.meterdays import (
    LocalClock,
    day_index,
    day_of,
    fold,
    local_midnight,
    read_intervals,
)
from gateway.store import repo
from gateway.store.models import MeterInterval, as_utc, iso


@dataclass(frozen=True)
class DayPart:
    """The part of an event's span on one local day: the minutes of that day it covers."""

    day: date
    start_min: int
    end_min: int


class EventSpan:
    """An event on the site's clock: its settlement intervals' span, rounded out to whole
    intervals; its first local day (`day`), and its `parts`, one per local day it covers
    (one, unless it crosses the site's midnight); `end_day` and `end_min`, where its end falls
    (the next day's 00:00 for an event ending at midnight)."""

    def __init__(self, start: datetime, end: datetime, clock: LocalClock, interval_min: int):
        self.clock = clock
        step = interval_min * 60
        begins, ends = as_utc(start).timestamp(), as_utc(end).timestamp()
        self.start = datetime.fromtimestamp(begins // step * step, UTC)
        self.end = datetime.fromtimestamp(-(-ends // step) * step, UTC)
        self.day = clock.day(self.start)
        self.end_day = clock.day(self.end)
        self.end_min = clock.minute(self.end, self.end_day)
        self.parts = []
        day, last = self.day, clock.day(self.end - timedelta(seconds=1))
        while day <= last:
            begin = self.start if day == self.day else local_midnight(day, clock.zone)
            stop = self.end if day == last else local_midnight(day + timedelta(days=1), clock.zone)
            self.parts.append(DayPart(day, clock.minute(begin, day), clock.minute(stop, day)))
            day += timedelta(days=1)


@dataclass(frozen=True)
class History:
    """The meter history a span's rules read: the intervals of the span's day and the days the
    rules look back over, as local days by index, and the program's event days to leave out."""

    intervals: list[MeterInterval]
    days: dict[int, MeterDay]
    event_days: set[int]


def lookback_days(names: Iterable[str]) -> int:
    """The most days any of the presets looks back over."""
    rules = [preset(n) for n in names]
    return max((int(getattr(r, "lookback_days", 0)) for r in rules), default=0)


def read_history(
    session: Session,
    span: EventSpan,
    *,
    names: Sequence[str],
    interval_min: int,
    exclude_event: str | None = None,
    until: datetime | None = None,
) -> History:
    """The history `names` need for `span`; readings of intervals ending after `until` (an
    event yet to come: what has not happened) are read as missing."""
    zone = span.clock.zone
    first_day = span.day - timedelta(days=lookback_days(names))
    intervals = read_intervals(
        session,
        start=local_midnight(first_day, zone),
        end=local_midnight(span.end_day + timedelta(days=1), zone),
        interval_min=interval_min,
    )
    if until is not None:
        intervals = [i if i.end <= until else replace(i, mean_kw=None, gap=True) for i in intervals]
    others = [e for e in repo.list_events(session) if e.id != exclude_event and not e.test]
    event_days = {day_index(span.clock.day(as_utc(e.start))) for e in others} | {
        day_index(span.clock.day(as_utc(e.end) - timedelta(microseconds=1))) for e in others
    }
    days = {d.day: d for d in fold(intervals, span.clock, interval_min)}
    return History(intervals, days, event_days - {day_index(p.day) for p in span.parts})


@dataclass(frozen=True)
class SpanBaseline:
    """A rule's baseline over an event's span: each day part's, or why there is none."""

    span: EventSpan
    parts: list[tuple[DayPart, Baseline | None, str | None]]

    @property
    def first(self) -> Baseline | None:
        """The first part's baseline that there is."""
        return next((found for _, found, _ in self.parts if found is not None), None)

    @property
    def reason(self) -> str | None:
        """Why a part has no baseline (each named by its day when the event crosses
        midnight), or None."""
        if len(self.parts) == 1:
            return self.parts[0][2]
        missing = [f"{part.day.isoformat()}: {why}" for part, _, why in self.parts if why]
        return "; ".join(missing) or None

    def kw(self, at: datetime) -> tuple[float | None, float | None]:
        """The baseline and the unadjusted baseline of the interval starting `at` [kW] (None
        where there is none, or the interval did not happen that day)."""
        day = self.span.clock.day(at)
        found = next((f for part, f, _ in self.parts if part.day == day), None)
        if found is None:
            return None, None
        slot = (self.span.clock.minute(at, day) - found.start_min) // found.interval_min
        values = float(found.baseline_kw[slot]), float(found.unadjusted_kw[slot])
        return tuple(None if math.isnan(v) else v for v in values)  # type: ignore[return-value]


def rule_baseline(name: str, span: EventSpan, history: History, calendar: Calendar) -> SpanBaseline:
    """The preset's baseline over the span, day part by day part, or why there is none (the
    rule's own answer: too few eligible days, a window without readings). Each part is judged
    on its own day's eligible days (the event's other days are event days); a later part takes
    the first's day-of adjustment, and a same-day level is read before the event's start and
    after its end, whatever their days."""
    rule = preset(name)
    event_days = history.event_days | {day_index(p.day) for p in span.parts}
    bounds = [(span.day, span.parts[0].start_min), (span.end_day, span.end_min)]
    same_day = isinstance(rule, SameDayRule)
    first: Baseline | None = None
    parts: list[tuple[DayPart, Baseline | None, str | None]] = []
    for part in span.parts:
        needed = [part.day, *(d for d, _ in bounds)] if same_day else [part.day]
        missing = [d for d in needed if day_index(d) not in history.days]
        found, why = None, f"no meter history on {missing[0].isoformat()}" if missing else None
        if not missing:
            ends = [(history.days[day_index(d)], m) for d, m in bounds] if same_day else []
            try:
                found = baseline(
                    rule,
                    history.days[day_index(part.day)],
                    [d for k, d in history.days.items() if k < day_index(part.day)],
                    start_min=part.start_min,
                    end_min=part.end_min,
                    calendar=calendar,
                    event_days=event_days,
                    adjusted_as=first,
                    starts_on=ends[0] if ends else None,
                    ends_on=ends[1] if ends else None,
                )
            except FlexModelError as exc:  # NoBaselineError: the rule's answer, not a failure
                why = dated(str(exc))
        if part is span.parts[0]:
            first = found
        parts.append((part, found, why))
    return SpanBaseline(span, parts)


def dated(reason: str) -> str:
    """flexmodel's day indices as the dates a person reads."""
    return re.sub(r"\bday (\d{4,6})\b", lambda m: day_of(int(m.group(1))).isoformat(), reason)


def day_dates(days: Iterable[int]) -> list[date]:
    return sorted(day_of(d) for d in days)


def meter_level(
    session: Session, rule: MeterBeforeRule, at: datetime, *, now: datetime, raw_keep_s: float
) -> tuple[dict[str, Any] | None, str | None]:
    """The mean of the raw samples in the rule's window ending at `at` (`meter_before`), with
    how many were estimated (or taken while the meter faulted), or None and why: the window's
    samples gone (kept `raw_keep_s` before `now`), a gap, a window not over yet."""
    begins = as_utc(at) - timedelta(seconds=rule.window_s)
    kept_from = now - timedelta(seconds=raw_keep_s)
    if begins < kept_from:
        return None, (
            f"the raw samples of {iso(begins)} to {iso(at)} are gone: they are kept "
            f"FLEXGATE_METER_HISTORY_RAW_KEEP_S ({raw_keep_s:g} s), from {iso(kept_from)} now"
        )
    samples = repo.meter_samples(session, start=begins, end=as_utc(at))
    try:
        found = meter_before(
            [(p.at - as_utc(at)).total_seconds() for p in samples],
            [p.kw for p in samples],
            trigger_s=0.0,
            window_s=rule.window_s,
            max_gap_s=rule.max_gap_s,
        )
    except FlexModelError as exc:  # NoBaselineError: the rule's answer
        return None, f"{exc} ({iso(at)})"
    return {
        "level_kw": found.baseline_kw,
        "start": iso(begins),
        "end": iso(at),
        "samples": found.samples,
        "estimated_samples": sum(1 for p in samples if p.estimated or p.fault),
        "fault_samples": sum(1 for p in samples if p.fault),
    }, None
