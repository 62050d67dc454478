"""A program rule's baseline read from the meter history: what settlement (after an event)
and the counted kW of a quote or an opt-in (before one) share.

`EventSpan` puts an event's [start, end) on the site's clock, rounded out to whole settlement
intervals; `read_history` reads the intervals the rules look back over and folds them into the
site's local days (`gateway.services.meterdays`), with the other events' days left out;
`rule_baseline` is one preset's baseline for the span, or the reason there is none;
`meter_level` a meter-before rule's level from the raw samples before a moment.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlmodel import Session

from flexmodel.baselines import (
    Baseline,
    Calendar,
    MeterBeforeRule,
    MeterDay,
    baseline,
    meter_before,
    preset,
)
from flexmodel.errors import FlexModelError
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


class EventSpan:
    """An event on the site's clock: its settlement intervals' span, its local day, and the
    minutes of that day it covers (`start_min`, `end_min`)."""

    def __init__(self, start: datetime, end: datetime, clock: LocalClock, interval_min: int):
        self.clock = clock
        step = interval_min * 60
        begins, ends = as_utc(start).timestamp(), as_utc(end).timestamp()
        self.start = datetime.fromtimestamp(begins // step * step, UTC)
        self.end = datetime.fromtimestamp(-(-ends // step) * step, UTC)
        self.day = clock.day(self.start)
        self.start_min = clock.minute(self.start, self.day)
        self.end_min = clock.minute(self.end, self.day)
        #: why no rule can give it a baseline, if so
        self.problem: str | None = None
        if clock.day(self.end - timedelta(seconds=1)) != self.day:
            self.problem = (
                f"the event crosses the site's midnight ({self.day.isoformat()}, "
                f"{clock.zone.key}): a baseline covers one local day"
            )


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
        end=local_midnight(span.day + timedelta(days=1), zone),
        interval_min=interval_min,
    )
    if until is not None:
        intervals = [i if i.end <= until else replace(i, mean_kw=None, gap=True) for i in intervals]
    others = [e for e in repo.list_events(session) if e.id != exclude_event and not e.test]
    event_days = {day_index(span.clock.day(as_utc(e.start))) for e in others} | {
        day_index(span.clock.day(as_utc(e.end) - timedelta(microseconds=1))) for e in others
    }
    days = {d.day: d for d in fold(intervals, span.clock, interval_min)}
    return History(intervals, days, event_days - {day_index(span.day)})


def rule_baseline(
    name: str, span: EventSpan, history: History, calendar: Calendar
) -> tuple[Baseline | None, str | None]:
    """The preset's baseline over the span, or None and why (the rule's own answer: too few
    eligible days, a window without readings, the span crossing midnight)."""
    if span.problem is not None:
        return None, span.problem
    today = history.days.get(day_index(span.day))
    if today is None:
        return None, f"no meter history on {span.day.isoformat()}"
    earlier = [d for d in history.days.values() if d.day < today.day]
    try:
        found = baseline(
            preset(name),
            today,
            earlier,
            start_min=span.start_min,
            end_min=span.end_min,
            calendar=calendar,
            event_days=history.event_days,
        )
    except FlexModelError as exc:  # NoBaselineError: the rule's answer, not a failure
        return None, dated(str(exc))
    return found, None


def slot_kw(found: Baseline, span: EventSpan, at: datetime) -> tuple[float | None, float | None]:
    """The baseline and the unadjusted baseline of the interval starting `at` [kW] (None
    where the interval did not happen that day)."""
    slot = (span.clock.minute(at, span.day) - found.start_min) // found.interval_min
    values = float(found.baseline_kw[slot]), float(found.unadjusted_kw[slot])
    return tuple(None if math.isnan(v) else v for v in values)  # type: ignore[return-value]


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
