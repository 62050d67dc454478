"""Baselines (docs/model.md, "Baselines"): the load a site would have drawn without an event.

A program pays for its baseline minus the metered load. Each rule here is one family's, every
parameter explicit; `PRESETS` name parameter sets of known programs, to be checked against the
program's own manual.

    x_of_y_baseline     per interval, the mean of the X highest-load of the last Y eligible
                        days, with a day-of adjustment (none, additive, multiplicative) capped
    same_day_baseline   one level: the mean of B hours before the event (ending A hours before
                        its start) and F hours after its end
    match_day_baseline  per interval, the mean of the N eligible days whose load over a window
                        before the event is closest to the event day's

`preset` also names the meter-before rule of fast events, `meterbefore-<S>s`
(`flexmodel.meterbefore`: the mean of the S seconds of samples before a trigger).

Data come as local days (`flexmodel.localdays.MeterDay`: one mean per clock interval from the
site's local midnight, daylight saving marked), and which days are weekdays and holidays as a
`Calendar` passed in.

Bad parameters raise `InvalidBaselineError` naming the parameter. Data that give no baseline
under a rule (too few eligible days, no reading in a window the rule needs) raise
`NoBaselineError` with the reason: a settlement records it for that event and rule, and goes
on with the others.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

import numpy as np

from flexmodel.errors import InvalidBaselineError, NoBaselineError
from flexmodel.localdays import MINUTES_PER_DAY, Calendar, FloatArray, IntArray, MeterDay
from flexmodel.meterbefore import MeterBeforeRule

Adjustment = Literal["none", "additive", "multiplicative"]

ADJUSTMENTS = ("none", "additive", "multiplicative")


def _check_hours(name: str, hours: float) -> None:
    if not (math.isfinite(hours) and hours >= 0.0):
        raise InvalidBaselineError(f"{name} {hours!r} must be a number of hours, at least 0")


def _check_share(name: str, share: float) -> None:
    if not (math.isfinite(share) and 0.0 <= share <= 1.0):
        raise InvalidBaselineError(f"{name} {share!r} must lie in [0, 1]")


def _check_days(name: str, days: int, least: int) -> None:
    if not (isinstance(days, int) and days >= least):
        raise InvalidBaselineError(
            f"{name} {days!r} must be a whole number of days, at least {least}"
        )


def _intervals_in(name: str, hours: float, interval_min: int) -> int:
    """How many clock intervals `hours` spans, refused unless a whole number."""
    count = round(hours * 60.0 / interval_min)
    if not math.isclose(count * interval_min, hours * 60.0, abs_tol=1e-9):
        raise InvalidBaselineError(
            f"{name} {hours:g} h is not a whole number of {interval_min}-minute intervals"
        )
    return count


@dataclass(frozen=True)
class XOfYRule:
    """The mean of the `x_days` highest-load of the last `y_days` eligible days, adjusted by
    the event day's load over `adjustment_hours` ending `adjustment_lead_hours` before the
    start, limited to +/- `cap_percent` of the unadjusted baseline (None: no limit)."""

    x_days: int
    y_days: int
    lookback_days: int
    adjustment: Adjustment
    adjustment_hours: float
    adjustment_lead_hours: float
    cap_percent: float | None
    max_estimated_share: float

    def __post_init__(self) -> None:
        _check_days("x_days", self.x_days, 1)
        _check_days("y_days", self.y_days, 1)
        if self.x_days > self.y_days:
            raise InvalidBaselineError(
                f"x_days {self.x_days} exceeds y_days {self.y_days}: the X days are among the Y"
            )
        _check_days("lookback_days", self.lookback_days, self.y_days)
        if self.adjustment not in ADJUSTMENTS:
            raise InvalidBaselineError(
                f"adjustment {self.adjustment!r} must be one of {', '.join(ADJUSTMENTS)}"
            )
        _check_hours("adjustment_hours", self.adjustment_hours)
        _check_hours("adjustment_lead_hours", self.adjustment_lead_hours)
        if self.adjustment != "none" and self.adjustment_hours == 0.0:
            raise InvalidBaselineError(
                f"adjustment_hours must be above 0 for the {self.adjustment} adjustment"
            )
        if self.cap_percent is not None and not (
            math.isfinite(self.cap_percent) and 0.0 <= self.cap_percent <= 100.0
        ):
            raise InvalidBaselineError(f"cap_percent {self.cap_percent!r} must lie in [0, 100]")
        _check_share("max_estimated_share", self.max_estimated_share)


@dataclass(frozen=True)
class SameDayRule:
    """One level for the whole event: the mean of the `before_hours` ending `lead_hours` before
    the start and the `after_hours` from its end, all intervals pooled."""

    before_hours: float
    after_hours: float
    lead_hours: float
    max_estimated_share: float

    def __post_init__(self) -> None:
        _check_hours("before_hours", self.before_hours)
        _check_hours("after_hours", self.after_hours)
        _check_hours("lead_hours", self.lead_hours)
        if self.before_hours == 0.0 and self.after_hours == 0.0:
            raise InvalidBaselineError("before_hours and after_hours cannot both be 0")
        _check_share("max_estimated_share", self.max_estimated_share)


@dataclass(frozen=True)
class MatchDayRule:
    """The mean of the `days` eligible days whose load over the `match_hours` ending
    `match_lead_hours` before the start is closest (mean absolute difference) to the event
    day's, found within `lookback_days`."""

    days: int
    match_hours: float
    match_lead_hours: float
    lookback_days: int
    max_estimated_share: float

    def __post_init__(self) -> None:
        _check_days("days", self.days, 1)
        _check_hours("match_hours", self.match_hours)
        if self.match_hours == 0.0:
            raise InvalidBaselineError("match_hours must be above 0")
        _check_hours("match_lead_hours", self.match_lead_hours)
        _check_days("lookback_days", self.lookback_days, self.days)
        _check_share("max_estimated_share", self.max_estimated_share)


BaselineRule = XOfYRule | SameDayRule | MatchDayRule
#: Every rule `preset` names: the day-based rules and meter-before.
Rule = BaselineRule | MeterBeforeRule

_TEN_OF_TEN = XOfYRule(
    x_days=10,
    y_days=10,
    lookback_days=45,
    adjustment="multiplicative",
    adjustment_hours=3.0,
    adjustment_lead_hours=1.0,
    cap_percent=20.0,
    max_estimated_share=0.1,
)
#: Named parameter sets. The program parameters are the issue's reading of CAISO's "10 of 10",
#: PJM's CBL, Same-Day 3+2 and Match-Day 3-day; the lookback (45 days), the estimated share
#: allowed (10%) and the match-day window (3 h ending 1 h before) are flexgate's choices. An
#: operator checks the preset against the program's manual before relying on it.
PRESETS: MappingProxyType[str, BaselineRule] = MappingProxyType(
    {
        "10of10": _TEN_OF_TEN,
        "10of10-40": replace(_TEN_OF_TEN, cap_percent=40.0),
        "high5of10": replace(_TEN_OF_TEN, x_days=5, adjustment="additive", cap_percent=None),
        "sameday-3+2": SameDayRule(
            before_hours=3.0, after_hours=2.0, lead_hours=0.0, max_estimated_share=0.1
        ),
        "matchday-3": MatchDayRule(
            days=3, match_hours=3.0, match_lead_hours=1.0, lookback_days=45, max_estimated_share=0.1
        ),
    }
)


#: `meterbefore-<S>s`: the meter-before rule over the S seconds (1 to 3600) before the trigger.
METER_BEFORE_NAME = re.compile(r"meterbefore-([1-9][0-9]{0,3})s")
METER_BEFORE_MAX_S = 3600
#: A meter-before window may go at most this long without a reading, and at most a quarter of
#: itself [s] (flexgate's choice, like the presets' lookback: check it against the program).
METER_BEFORE_GAP_S = 10.0
#: The names `preset` takes, as a person reads them.
RULE_NAMES = ", ".join([*PRESETS, "meterbefore-<S>s"])


def preset(name: str) -> Rule:
    """The rule a preset names, or the meter-before rule `meterbefore-<S>s` names."""
    if name in PRESETS:
        return PRESETS[name]
    match = METER_BEFORE_NAME.fullmatch(name)
    if match and int(match.group(1)) <= METER_BEFORE_MAX_S:
        window_s = float(match.group(1))
        return MeterBeforeRule(window_s, min(METER_BEFORE_GAP_S, window_s / 4))
    raise InvalidBaselineError(f"preset {name!r} is not one of {RULE_NAMES}")


def is_preset(name: str) -> bool:
    """Whether `preset` knows the name."""
    try:
        preset(name)
    except InvalidBaselineError:
        return False
    return True


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


def _baseline(
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
    first = start_min // event.interval_min
    baseline_kw.flags.writeable = unadjusted_kw.flags.writeable = False
    return Baseline(
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


def _event_slots(event: MeterDay, start_min: int, end_min: int) -> slice:
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


def _window_before(
    event: MeterDay, start: int, hours: float, lead_hours: float, names: tuple[str, str]
) -> slice:
    """The clock intervals of `hours` ending `lead_hours` before interval `start`."""
    length = _intervals_in(names[0], hours, event.interval_min)
    lead = _intervals_in(names[1], lead_hours, event.interval_min)
    first = start - lead - length
    if first < 0:
        raise NoBaselineError(
            f"the {hours:g} h ending {lead_hours:g} h before the start begin before the event "
            f"day's midnight (day {event.day})"
        )
    return slice(first, start - lead)


def _readings(event: MeterDay, window: slice, what: str) -> FloatArray:
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


def _mean_of_days(days: Sequence[MeterDay], slots: slice) -> FloatArray:
    """Each interval's mean over the days it happened on (NaN where on none)."""
    loads = np.stack([d.load_kw[slots] for d in days])
    happened = np.stack([d.exists[slots] for d in days])
    count = happened.sum(axis=0)
    total = np.where(happened, loads, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _mean_load(day: MeterDay, slots: slice) -> float:
    values = day.load_kw[slots][day.exists[slots]]
    return float(values.mean()) if values.size else -math.inf


def _capped(adjusted: FloatArray, unadjusted: FloatArray, cap_percent: float | None) -> FloatArray:
    if cap_percent is None:
        return adjusted
    one = unadjusted * (1.0 - cap_percent / 100.0)
    other = unadjusted * (1.0 + cap_percent / 100.0)
    return np.clip(adjusted, np.minimum(one, other), np.maximum(one, other))


def _adjustment(
    rule: XOfYRule, event: MeterDay, start: int, chosen: Sequence[MeterDay]
) -> tuple[float, float]:
    """The day-of adjustment (factor, offset [kW]) for an event from interval `start`."""
    window = _window_before(
        event,
        start,
        rule.adjustment_hours,
        rule.adjustment_lead_hours,
        ("adjustment_hours", "adjustment_lead_hours"),
    )
    metered_kw = float(_readings(event, window, "the adjustment window").mean())
    reference = _mean_of_days(chosen, window)[event.exists[window]]
    reference_kw = float(reference.mean())
    if rule.adjustment == "additive":
        return 1.0, metered_kw - reference_kw
    if not reference_kw > 0.0:
        raise NoBaselineError(
            f"the baseline's mean over the adjustment window is {reference_kw:g} kW: no ratio"
        )
    return metered_kw / reference_kw, 0.0


def x_of_y_baseline(
    rule: XOfYRule,
    event: MeterDay,
    history: Sequence[MeterDay],
    *,
    start_min: int,
    end_min: int,
    calendar: Calendar,
    event_days: Collection[int],
    adjusted_as: Baseline | None = None,
) -> Baseline:
    """The X-of-Y baseline for an event from `start_min` to `end_min` on `event`'s day.

    The Y eligible days are the newest; of those, the X with the highest mean load over the
    event's intervals (the newer first on a tie). The adjustment compares the event day's mean
    reading over its window with the unadjusted baseline's mean there: their ratio
    (multiplicative) or difference [kW] (additive). `adjusted_as`: the baseline of the part
    of the same event on an earlier day (one crossing midnight), whose adjustment, from the
    hours before the event's start, this day's part takes (capped against its own).
    """
    slots = _event_slots(event, start_min, end_min)
    days, why = eligible_days(
        event,
        history,
        lookback_days=rule.lookback_days,
        calendar=calendar,
        event_days=event_days,
        max_estimated_share=rule.max_estimated_share,
    )
    if len(days) < rule.y_days:
        raise NoBaselineError(f"{len(days)} eligible days, {rule.y_days} needed ({why})")
    chosen = sorted(days[: rule.y_days], key=lambda d: -_mean_load(d, slots))[: rule.x_days]
    unadjusted = _mean_of_days(chosen, slots)
    unadjusted[~event.exists[slots]] = np.nan
    used = tuple(sorted((d.day for d in chosen), reverse=True))
    if rule.adjustment == "none":
        return _baseline(rule, event, start_min, unadjusted, unadjusted.copy(), used)
    if adjusted_as is None:
        factor, offset_kw = _adjustment(rule, event, slots.start, chosen)
    else:
        factor, offset_kw = adjusted_as.adjustment_factor, adjusted_as.adjustment_kw
    adjusted = unadjusted * factor + offset_kw
    limited = _capped(adjusted, unadjusted, rule.cap_percent)
    moved = np.abs(limited - adjusted)
    return _baseline(
        rule,
        event,
        start_min,
        unadjusted,
        limited,
        used,
        adjustment_factor=factor,
        adjustment_kw=offset_kw,
        capped=bool((moved[np.isfinite(moved)] > 1e-9).any()),
    )


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
    slots = _event_slots(event, start_min, end_min)
    first, first_min = starts_on if starts_on is not None else (event, start_min)
    last, last_min = ends_on if ends_on is not None else (event, end_min)
    for day in (first, last):
        if day.interval_min != event.interval_min:
            raise InvalidBaselineError(
                f"interval_min {day.interval_min} of day {day.day} differs from the event day's"
            )
    start = _event_slots(first, first_min, MINUTES_PER_DAY).start
    before = _window_before(
        first, start, rule.before_hours, rule.lead_hours, ("before_hours", "lead_hours")
    )
    end = _event_slots(last, 0, last_min).stop if last_min else 0
    after_length = _intervals_in("after_hours", rule.after_hours, event.interval_min)
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
    return _baseline(rule, event, start_min, level, level.copy(), used)


def match_day_baseline(
    rule: MatchDayRule,
    event: MeterDay,
    history: Sequence[MeterDay],
    *,
    start_min: int,
    end_min: int,
    calendar: Calendar,
    event_days: Collection[int],
) -> Baseline:
    """The match-day baseline: each interval's mean over the `rule.days` eligible days whose
    load over the match window is closest to the event day's readings there (mean absolute
    difference over the intervals both days had; the newer first on a tie)."""
    slots = _event_slots(event, start_min, end_min)
    window = _window_before(
        event,
        slots.start,
        rule.match_hours,
        rule.match_lead_hours,
        ("match_hours", "match_lead_hours"),
    )
    _readings(event, window, "the match window")
    days, why = eligible_days(
        event,
        history,
        lookback_days=rule.lookback_days,
        calendar=calendar,
        event_days=event_days,
        max_estimated_share=rule.max_estimated_share,
    )
    if len(days) < rule.days:
        raise NoBaselineError(f"{len(days)} eligible days, {rule.days} needed ({why})")

    def distance_kw(day: MeterDay) -> float:
        both = day.exists[window] & event.exists[window]
        if not both.any():
            return math.inf
        return float(np.abs(day.load_kw[window][both] - event.load_kw[window][both]).mean())

    chosen = sorted(days, key=distance_kw)[: rule.days]
    mean_kw = _mean_of_days(chosen, slots)
    mean_kw[~event.exists[slots]] = np.nan
    used = tuple(sorted((d.day for d in chosen), reverse=True))
    return _baseline(rule, event, start_min, mean_kw, mean_kw.copy(), used)


def baseline(
    rule: Rule,
    event: MeterDay,
    history: Sequence[MeterDay],
    *,
    start_min: int,
    end_min: int,
    calendar: Calendar,
    event_days: Collection[int],
    adjusted_as: Baseline | None = None,
    starts_on: tuple[MeterDay, int] | None = None,
    ends_on: tuple[MeterDay, int] | None = None,
) -> Baseline:
    """The baseline of any day-based rule (a preset's, for one), by its kind; for the part on
    one day of an event crossing midnight, `adjusted_as` (X of Y), `starts_on` and `ends_on`
    (same day) as those rules take them. A match day is matched on the hours before the
    event's start: it gives no baseline for a part after the first (`adjusted_as` given)."""
    if isinstance(rule, MeterBeforeRule):
        raise InvalidBaselineError(
            "a meter-before rule reads the samples before a trigger, not days: meter_before"
        )
    if isinstance(rule, SameDayRule):
        return same_day_baseline(
            rule, event, start_min=start_min, end_min=end_min, starts_on=starts_on, ends_on=ends_on
        )
    if isinstance(rule, XOfYRule):
        return x_of_y_baseline(
            rule,
            event,
            history,
            start_min=start_min,
            end_min=end_min,
            calendar=calendar,
            event_days=event_days,
            adjusted_as=adjusted_as,
        )
    if adjusted_as is not None:
        raise NoBaselineError(
            f"a match day is matched on the hours before the event's start, on day "
            f"{adjusted_as.day}: it gives no baseline for the event's part on day {event.day}"
        )
    return match_day_baseline(
        rule,
        event,
        history,
        start_min=start_min,
        end_min=end_min,
        calendar=calendar,
        event_days=event_days,
    )
