"""The same-day baseline (docs/model.md, "Baselines"): one level, the mean of B hours before
the event (ending A hours before its start) and F hours after its end."""

from __future__ import annotations

import numpy as np

from flexmodel.baselinedays import Baseline, event_slots, intervals_in, window_before
from flexmodel.baselinerules import SameDayRule
from flexmodel.errors import InvalidBaselineError, NoBaselineError
from flexmodel.localdays import MINUTES_PER_DAY, MeterDay


def same_day_baseline(
    rule: SameDayRule,
    event: MeterDay,
    *,
    start_min: int,
    end_min: int,
    starts_on: tuple[MeterDay, int] | None = None,
    ends_on: tuple[MeterDay, int] | None = None,
) -> Baseline:
    """The same-day baseline: one level, the pooled mean of the intervals that happened in the
    hours before and after the event, every one with a reading, at most the rule's share
    estimated. Needs the event day's readings after the event's end.

    For an event across midnight, this is its part from `start_min` to `end_min` on `event`'s
    day; `starts_on` and `ends_on` are the day and minute of the event's start and end (default
    this day's), where the hours before and after are read: every part gets the same level."""
    slots = event_slots(event, start_min, end_min)
    first, first_min = starts_on if starts_on is not None else (event, start_min)
    last, last_min = ends_on if ends_on is not None else (event, end_min)
    for day in (first, last):
        if day.interval_min != event.interval_min:
            raise InvalidBaselineError(
                f"interval_min {day.interval_min} of day {day.day} differs from the event day's"
            )
    start = event_slots(first, first_min, MINUTES_PER_DAY).start
    before = window_before(
        first, start, rule.before_hours, rule.lead_hours, ("before_hours", "lead_hours")
    )
    end = event_slots(last, 0, last_min).stop if last_min else 0
    after_length = intervals_in("after_hours", rule.after_hours, event.interval_min)
    after = slice(end, end + after_length)
    if after.stop > last.load_kw.size:
        raise NoBaselineError(
            f"the {rule.after_hours:g} h after the event end after the event day's midnight "
            f"(day {last.day})"
        )
    values, estimated = [], 0
    for day, window in ((first, before), (last, after)):
        inside = np.zeros(day.load_kw.size, bool)
        inside[window] = True
        inside &= day.exists
        values.append(day.load_kw[inside])
        estimated += int(day.estimated[inside].sum())
    pooled = np.concatenate(values)
    if np.isnan(pooled).any() or not pooled.size:
        raise NoBaselineError(f"day {event.day} has no reading in every interval around the event")
    if estimated > rule.max_estimated_share * pooled.size:
        raise NoBaselineError(
            f"day {event.day} has more than {rule.max_estimated_share:g} of the intervals "
            "around the event estimated"
        )
    level = np.full(slots.stop - slots.start, float(pooled.mean()))
    level[~event.exists[slots]] = np.nan
    used = tuple(sorted({first.day, last.day}, reverse=True))
    return Baseline.of(rule, event, start_min, level, level.copy(), used)
