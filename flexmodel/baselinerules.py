"""The day-based baseline rules' parameters, one class per family, each checked as it is made
(docs/model.md, "Baselines"): X of Y days (`XOfYRule`), same day (`SameDayRule`) and match day
(`MatchDayRule`). Bad parameters raise `InvalidBaselineError` naming the parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flexmodel.errors import InvalidBaselineError

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
