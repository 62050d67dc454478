"""The X-of-Y baseline (docs/model.md, "Baselines"): per interval, the mean of the X
highest-load of the last Y eligible days, with a day-of adjustment (none, additive,
multiplicative) capped."""

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
from flexmodel.baselinerules import XOfYRule
from flexmodel.errors import NoBaselineError
from flexmodel.localdays import Calendar, FloatArray, MeterDay


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
    window = window_before(
        event,
        start,
        rule.adjustment_hours,
        rule.adjustment_lead_hours,
        ("adjustment_hours", "adjustment_lead_hours"),
    )
    metered_kw = float(event_readings(event, window, "the adjustment window").mean())
    reference = mean_of_days(chosen, window)[event.exists[window]]
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
    slots = event_slots(event, start_min, end_min)
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
    unadjusted = mean_of_days(chosen, slots)
    unadjusted[~event.exists[slots]] = np.nan
    used = tuple(sorted((d.day for d in chosen), reverse=True))
    if rule.adjustment == "none":
        return Baseline.of(rule, event, start_min, unadjusted, unadjusted.copy(), used)
    if adjusted_as is None:
        factor, offset_kw = _adjustment(rule, event, slots.start, chosen)
    else:
        factor, offset_kw = adjusted_as.adjustment_factor, adjusted_as.adjustment_kw
    adjusted = unadjusted * factor + offset_kw
    limited = _capped(adjusted, unadjusted, rule.cap_percent)
    moved = np.abs(limited - adjusted)
    return Baseline.of(
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
