"""Baselines (docs/model.md, "Baselines"): the load a site would have drawn without an event.

A program pays for its baseline minus the metered load. Each rule is one family's, every
parameter explicit (`flexmodel.baselinerules`); `PRESETS` name parameter sets of known programs,
to be checked against the program's own manual. `baseline` computes any day-based rule's by
its family:

    x_of_y_baseline     per interval, the mean of the X highest-load of the last Y eligible
                        days, with a day-of adjustment (none, additive, multiplicative) capped
                        (`flexmodel.xofy`)
    same_day_baseline   one level: the mean of B hours before the event (ending A hours before
                        its start) and F hours after its end (`flexmodel.sameday`)
    match_day_baseline  per interval, the mean of the N eligible days whose load over a window
                        before the event is closest to the event day's (`flexmodel.matchday`)

`preset` also names the meter-before rule of fast events, `meterbefore-<S>s`
(`flexmodel.meterbefore`: the mean of the S seconds of samples before a trigger).

Data come as local days (`flexmodel.localdays.MeterDay`: one mean per clock interval from the
site's local midnight, daylight saving marked), and which days are weekdays and holidays as a
`Calendar` passed in; what the rules share, the `Baseline` they give among it, is
`flexmodel.baselinedays`'s.

Bad parameters raise `InvalidBaselineError` naming the parameter. Data that give no baseline
under a rule (too few eligible days, no reading in a window the rule needs) raise
`NoBaselineError` with the reason: a settlement records it for that event and rule, and goes
on with the others.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import replace
from types import MappingProxyType

from flexmodel.baselinedays import Baseline
from flexmodel.baselinerules import BaselineRule, MatchDayRule, SameDayRule, XOfYRule
from flexmodel.errors import InvalidBaselineError, NoBaselineError
from flexmodel.localdays import Calendar, MeterDay
from flexmodel.matchday import match_day_baseline
from flexmodel.meterbefore import MeterBeforeRule
from flexmodel.sameday import same_day_baseline
from flexmodel.xofy import x_of_y_baseline

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
