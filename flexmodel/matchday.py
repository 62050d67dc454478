"""The match-day baseline (docs/model.md, "Baselines"): per interval, the mean of the N
eligible days whose load over a window before the event is closest to the event day's."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from flexmodel.baselinedays import (
    Baseline,
    eligible_days,
    event_readings,
    event_slots,
    mean_of_days,
    window_before,
)
from flexmodel.baselinerules import MatchDayRule
from flexmodel.errors import NoBaselineError
from flexmodel.localdays import Calendar, MeterDay


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
    slots = event_slots(event, start_min, end_min)
    window = window_before(
        event,
        slots.start,
        rule.match_hours,
        rule.match_lead_hours,
        ("match_hours", "match_lead_hours"),
    )
    event_readings(event, window, "the match window")
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
    mean_kw = mean_of_days(chosen, slots)
    mean_kw[~event.exists[slots]] = np.nan
    used = tuple(sorted((d.day for d in chosen), reverse=True))
    return Baseline.of(rule, event, start_min, mean_kw, mean_kw.copy(), used)
