"""Meter data on a site's local days (docs/model.md, "Baselines"): what the baseline rules of
`flexmodel.baselines` read.

A `MeterDay` is one local day at the site's meter: one mean per clock interval from the site's
local midnight, with the times each interval occurred that day (0 for the hour skipped at
spring forward, 2 for the hour repeated at fall back, whose value is the mean of both).
`local_days` builds them from UTC intervals and their UTC offsets (the caller's time-zone
database gives the offsets; flexmodel reads no clock). Days are integers (local days since
1970-01-01 from `local_days`); which are weekdays and holidays comes from a `Calendar`.

Data of the wrong shape raise `InvalidBaselineError` naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from flexmodel.errors import InvalidBaselineError

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

INTERVAL_MINUTES = (1, 5, 15, 30, 60)
MINUTES_PER_DAY = 1440
SECONDS_PER_DAY = 86400


def _check_interval_min(interval_min: int) -> None:
    if interval_min not in INTERVAL_MINUTES:
        raise InvalidBaselineError(
            f"interval_min {interval_min!r} must be one of {', '.join(map(str, INTERVAL_MINUTES))}"
        )


@dataclass(frozen=True)
class Calendar:
    """Which days are weekdays. `monday` is any day index that fell on a Monday (4 for
    `local_days`' days since 1970-01-01); `weekend` the days of the week (0 Monday .. 6
    Sunday) that are not weekdays; `holidays` the day indices of the program's holidays."""

    holidays: frozenset[int] = frozenset()
    monday: int = 4
    weekend: frozenset[int] = frozenset({5, 6})

    def __post_init__(self) -> None:
        if not self.weekend <= frozenset(range(7)):
            raise InvalidBaselineError(f"weekend {sorted(self.weekend)} must hold days 0 to 6")

    def is_weekday(self, day: int) -> bool:
        return day not in self.holidays and (day - self.monday) % 7 not in self.weekend


@dataclass(frozen=True)
class MeterDay:
    """One local day at the site's meter, one entry per clock interval from local midnight.

    `load_kw`: the mean load of each interval, NaN where there was no reading [kW];
    `estimated`: the intervals estimated rather than metered; `occurrences`: how many times
    each clock interval happened that day (1; 0 in the hour skipped at spring forward, 2 in the
    hour repeated at fall back, `load_kw` holding the mean of both). Build with `meter_day` or
    `local_days`.
    """

    day: int
    interval_min: int
    load_kw: FloatArray
    estimated: BoolArray
    occurrences: IntArray

    def __post_init__(self) -> None:
        _check_interval_min(self.interval_min)
        size = MINUTES_PER_DAY // self.interval_min
        for name, dtype in (
            ("load_kw", np.float64),
            ("estimated", np.bool_),
            ("occurrences", np.int64),
        ):
            array = np.array(getattr(self, name), dtype=dtype)
            if array.shape != (size,):
                raise InvalidBaselineError(
                    f"{name} of day {self.day} holds {array.size} values, not the {size} "
                    f"{self.interval_min}-minute intervals of a day"
                )
            array.flags.writeable = False
            object.__setattr__(self, name, array)
        if not np.isin(self.occurrences, (0, 1, 2)).all():
            raise InvalidBaselineError(f"occurrences of day {self.day} must be 0, 1 or 2")

    @property
    def exists(self) -> BoolArray:
        """The clock intervals that happened that day."""
        return self.occurrences > 0

    def is_complete(self, max_estimated_share: float) -> bool:
        """Every interval that happened has a reading, and at most `max_estimated_share` of
        them are estimates."""
        exists = self.exists
        if np.isnan(self.load_kw[exists]).any():
            return False
        return int(self.estimated[exists].sum()) <= max_estimated_share * int(exists.sum())


def meter_day(
    day: int,
    load_kw: Sequence[float] | FloatArray,
    *,
    interval_min: int,
    estimated: Sequence[bool] | BoolArray | None = None,
    occurrences: Sequence[int] | IntArray | None = None,
) -> MeterDay:
    """A `MeterDay` with nothing estimated and every interval happening once, unless told."""
    size = len(load_kw)
    return MeterDay(
        day=day,
        interval_min=interval_min,
        load_kw=np.asarray(load_kw, dtype=np.float64),
        estimated=np.zeros(size, bool) if estimated is None else np.asarray(estimated, bool),
        occurrences=np.ones(size, np.int64) if occurrences is None else np.asarray(occurrences),
    )


def local_days(
    start_utc_s: Sequence[int] | IntArray,
    utc_offset_s: Sequence[int] | IntArray,
    load_kw: Sequence[float] | FloatArray,
    *,
    interval_min: int,
    estimated: Sequence[bool] | BoolArray | None = None,
) -> list[MeterDay]:
    """Interval data on a complete UTC grid (every interval's start [s since the Unix epoch],
    NaN where no reading) folded onto the site's local days.

    `utc_offset_s` is each interval's local offset from UTC [s] (from the site's time zone).
    An interval repeated at fall back gets the mean of both readings (NaN if either is
    missing; estimated if either is); an interval skipped at spring forward occurs 0 times.
    Intervals of the first and last day outside the grid are missing (NaN, once).
    """
    _check_interval_min(interval_min)
    step_s = interval_min * 60
    local_s, loads, flags = _local_grid(start_utc_s, utc_offset_s, load_kw, estimated, interval_min)
    days = local_s // SECONDS_PER_DAY
    slots = (local_s % SECONDS_PER_DAY) // step_s
    out = []
    for day in range(int(days[0]), int(days[-1]) + 1):
        mine = days == day
        folded = _fold_day(
            day,
            slots[mine],
            loads[mine],
            flags[mine],
            interval_min,
            first=bool(day == days[0]),
            last=bool(day == days[-1]),
        )
        if folded is not None:
            out.append(folded)
    return out


def _local_grid(
    start_utc_s: Sequence[int] | IntArray,
    utc_offset_s: Sequence[int] | IntArray,
    load_kw: Sequence[float] | FloatArray,
    estimated: Sequence[bool] | BoolArray | None,
    interval_min: int,
) -> tuple[IntArray, FloatArray, BoolArray]:
    """Each interval's local start [s since the Unix epoch on the site's clock], load [kW] and
    estimated flag, refused unless on a complete UTC grid and on the local clock."""
    step_s = interval_min * 60
    starts = np.asarray(start_utc_s, dtype=np.int64)
    offsets = np.asarray(utc_offset_s, dtype=np.int64)
    loads = np.asarray(load_kw, dtype=np.float64)
    flags = np.zeros(loads.size, bool) if estimated is None else np.asarray(estimated, bool)
    if not starts.size or not (offsets.shape == loads.shape == flags.shape == starts.shape):
        raise InvalidBaselineError(
            "start_utc_s, utc_offset_s, load_kw and estimated must be equally long, not empty"
        )
    if (np.diff(starts) != step_s).any():
        raise InvalidBaselineError(
            f"start_utc_s must step by {step_s} s with no gap (a missing reading is NaN)"
        )
    local_s = starts + offsets
    if (local_s % step_s).any():
        raise InvalidBaselineError(
            f"utc_offset_s must put every interval on the local {interval_min}-minute clock"
        )
    return local_s, loads, flags


def _fold_day(
    day: int,
    slots: IntArray,
    loads: FloatArray,
    flags: BoolArray,
    interval_min: int,
    *,
    first: bool,
    last: bool,
) -> MeterDay | None:
    """One local day from its intervals' clock slots, loads [kW] and estimated flags (None
    when none happened: a whole day skipped, as Samoa's 30 December 2011). On the grid's
    `first` and `last` day, the intervals outside the grid count once, with no reading."""
    size = MINUTES_PER_DAY // interval_min
    happened = np.bincount(slots, minlength=size)
    if not happened.any():
        return None
    total = np.bincount(slots, weights=loads, minlength=size)
    flagged = np.bincount(slots, weights=flags.astype(float), minlength=size)
    mean = np.full(size, np.nan)
    mean[happened > 0] = total[happened > 0] / happened[happened > 0]
    # Before or after the grid nothing says whether an interval happened: count it
    # once, with no reading, so the day is incomplete rather than short.
    count = happened.copy()
    covered = np.flatnonzero(happened)
    if first:
        count[: covered[0]] = 1
    if last:
        count[covered[-1] + 1 :] = 1
    return MeterDay(
        day=day,
        interval_min=interval_min,
        load_kw=mean,
        estimated=flagged > 0,
        occurrences=count.astype(np.int64),
    )
