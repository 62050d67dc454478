"""What the day-based baseline rules share (docs/model.md, "Baselines"): the event's clock
intervals, the windows before it, the eligible days and their means, and the `Baseline` a rule
gives. Data that give no baseline raise `NoBaselineError` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from flexmodel.baselinerules import BaselineRule
from flexmodel.errors import InvalidBaselineError, NoBaselineError
from flexmodel.localdays import MINUTES_PER_DAY, Calendar, FloatArray, IntArray, MeterDay


@dataclass(frozen=True)
class Baseline:
    """A rule's baseline for one event, one entry per clock interval of the event.

    `baseline_kw` is what the program counts (NaN in the intervals that did not happen);
    `unadjusted_kw`, the same before the day-of adjustment. `adjustment_factor` and
    `adjustment_kw` are the adjustment the rule computed (1 and 0 when none), before any cap;
    `capped` says the cap limited at least one interval. `occurrences` counts each interval's
    happenings on the event day (2 in a repeated hour: twice the energy per kW).
    """

    rule: BaselineRule
    day: int
    interval_min: int
    start_min: int
    baseline_kw: FloatArray
    unadjusted_kw: FloatArray
    occurrences: IntArray
    days_used: tuple[int, ...]
    adjustment_factor: float = 1.0
    adjustment_kw: float = 0.0
    capped: bool = False

    @property
    def interval_start_min(self) -> IntArray:
        """Each interval's start, in minutes after local midnight on the clock."""
        count = self.baseline_kw.size
        return self.start_min + self.interval_min * np.arange(count, dtype=np.int64)

    @property
    def no_baseline_min(self) -> tuple[int, ...]:
        """The starts of the intervals with no baseline (they did not happen that day)."""
        return tuple(int(m) for m in self.interval_start_min[np.isnan(self.baseline_kw)])

    @classmethod
    def of(
        cls,
        rule: BaselineRule,
        event: MeterDay,
        start_min: int,
        unadjusted_kw: FloatArray,
        baseline_kw: FloatArray,
        days_used: tuple[int, ...],
        *,
        adjustment_factor: float = 1.0,
        adjustment_kw: float = 0.0,
        capped: bool = False,
    ) -> Baseline:
        """The baseline `rule` gave for `event` from `start_min`, its arrays made read-only and
        the event day's occurrences of its intervals taken along."""
        first = start_min // event.interval_min
        baseline_kw.flags.writeable = unadjusted_kw.flags.writeable = False
        return cls(
            rule=rule,
            day=event.day,
            interval_min=event.interval_min,
            start_min=start_min,
            baseline_kw=baseline_kw,
            unadjusted_kw=unadjusted_kw,
            occurrences=event.occurrences[first : first + baseline_kw.size],
            days_used=days_used,
            adjustment_factor=adjustment_factor,
            adjustment_kw=adjustment_kw,
            capped=capped,
        )


def intervals_in(name: str, hours: float, interval_min: int) -> int:
    """How many clock intervals `hours` spans, refused unless a whole number."""
    count = round(hours * 60.0 / interval_min)
    if not math.isclose(count * interval_min, hours * 60.0, abs_tol=1e-9):
        raise InvalidBaselineError(
            f"{name} {hours:g} h is not a whole number of {interval_min}-minute intervals"
        )
    return count


def event_slots(event: MeterDay, start_min: int, end_min: int) -> slice:
    """The event day's clock intervals from `start_min` to `end_min` [minutes after local
    midnight], refused unless both are on the clock and the end comes after the start."""
    step = event.interval_min
    for name, minute in (("start_min", start_min), ("end_min", end_min)):
        on_clock = isinstance(minute, int | np.integer) and minute % step == 0
        if not (on_clock and 0 <= minute <= MINUTES_PER_DAY):
            raise InvalidBaselineError(
                f"{name} {minute!r} must be a minute of the day on the {step}-minute clock"
            )
    if end_min <= start_min:
        raise InvalidBaselineError(f"end_min {end_min} must come after start_min {start_min}")
    return slice(start_min // step, end_min // step)


def window_before(
    event: MeterDay, start: int, hours: float, lead_hours: float, names: tuple[str, str]
) -> slice:
    """The clock intervals of `hours` ending `lead_hours` before interval `start`."""
    length = intervals_in(names[0], hours, event.interval_min)
    lead = intervals_in(names[1], lead_hours, event.interval_min)
    first = start - lead - length
    if first < 0:
        raise NoBaselineError(
            f"the {hours:g} h ending {lead_hours:g} h before the start begin before the event "
            f"day's midnight (day {event.day})"
        )
    return slice(first, start - lead)


def event_readings(event: MeterDay, window: slice, what: str) -> FloatArray:
    """The event day's readings in the intervals of `window` that happened, all present."""
    values = event.load_kw[window][event.exists[window]]
    if np.isnan(values).any() or not values.size:
        raise NoBaselineError(f"day {event.day} has no reading in every interval of {what}")
    return values


def eligible_days(
    event: MeterDay,
    history: Sequence[MeterDay],
    *,
    lookback_days: int,
    calendar: Calendar,
    event_days: Collection[int],
    max_estimated_share: float,
) -> tuple[list[MeterDay], str]:
    """The eligible days before the event's, newest first, and why the others are not: within
    `lookback_days`, not an event day of the program, of the event day's type (weekday, or
    weekend and holiday), complete."""
    seen: set[int] = set()
    for day in history:
        if day.interval_min != event.interval_min:
            raise InvalidBaselineError(
                f"interval_min {day.interval_min} of day {day.day} differs from the event "
                f"day's {event.interval_min}"
            )
        if day.day in seen:
            raise InvalidBaselineError(f"history holds day {day.day} twice")
        seen.add(day.day)
    recent = sorted(
        (d for d in history if event.day - lookback_days <= d.day < event.day),
        key=lambda d: -d.day,
    )
    weekday = calendar.is_weekday(event.day)
    excluded = {"event days": 0, "other day type": 0, "incomplete": 0}
    eligible = []
    for day in recent:
        if day.day in event_days:
            excluded["event days"] += 1
        elif calendar.is_weekday(day.day) != weekday:
            excluded["other day type"] += 1
        elif not day.is_complete(max_estimated_share):
            excluded["incomplete"] += 1
        else:
            eligible.append(day)
    why = ", ".join(f"{n} {reason}" for reason, n in excluded.items())
    return eligible, f"{len(recent)} days in the {lookback_days} before day {event.day}: {why}"


def mean_of_days(days: Sequence[MeterDay], slots: slice) -> FloatArray:
    """Each interval's mean over the days it happened on (NaN where on none)."""
    loads = np.stack([d.load_kw[slots] for d in days])
    happened = np.stack([d.exists[slots] for d in days])
    count = happened.sum(axis=0)
    total = np.where(happened, loads, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
