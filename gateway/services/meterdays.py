"""The meter history on the site's clock: settlement intervals of 1 to 60 minutes, and the
local days a baseline reads (`flexmodel.localdays.MeterDay`).

The history keeps 1-, 5-, 15- and 30-minute intervals aligned on UTC. A 60-minute interval
is made of its two 30-minute halves: their mean, a gap if either is, estimated (or faulted)
if either is, its estimated share the halves' mean. The site's offsets from UTC come from the
IANA time-zone database (`zoneinfo`), interval by interval, so a daylight-saving day folds
as `flexmodel.localdays.local_days` documents; the settings refuse a zone whose offset is
off the intervals' grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import numpy as np
from sqlmodel import Session

from flexmodel.localdays import Calendar, MeterDay, local_days
from gateway.store import repo
from gateway.store.models import MeterInterval

EPOCH = date(1970, 1, 1)
#: A 60-minute interval is rolled from this many of these stored ones [s].
COMPOSED = {3600: (2, 1800)}


def day_index(day: date) -> int:
    """A local day as `flexmodel.baselines` counts it: days since 1970-01-01."""
    return (day - EPOCH).days


def day_of(index: int) -> date:
    return EPOCH + timedelta(days=index)


def local_midnight(day: date, zone: ZoneInfo) -> datetime:
    """The UTC instant the site's day begins (the first that exists, on a zone that skips
    midnight)."""
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


def calendar(holidays: frozenset[date]) -> Calendar:
    return Calendar(holidays=frozenset(day_index(d) for d in holidays))


def read_intervals(
    session: Session, *, start: datetime, end: datetime, interval_min: int
) -> list[MeterInterval]:
    """Every interval of `interval_min` overlapping [start, end), gaps included (1, 5, 15,
    30 stored; 60 from the 30-minute halves)."""
    length_s = interval_min * 60
    if length_s not in COMPOSED:
        return repo.meter_intervals(session, start=start, end=end, length_s=length_s)
    parts, part_s = COMPOSED[length_s]
    first = datetime.fromtimestamp(start.timestamp() // length_s * length_s, UTC)
    halves = repo.meter_intervals(session, start=first, end=end, length_s=part_s)
    out = []
    for at in range(0, len(halves) - parts + 1, parts):
        out.append(_combined(halves[at : at + parts]))
    return out


def _combined(parts: Sequence[MeterInterval]) -> MeterInterval:
    means = [p.mean_kw for p in parts]
    return MeterInterval(
        start=parts[0].start,
        end=parts[-1].end,
        mean_kw=None if None in means else float(np.mean([m for m in means if m is not None])),
        samples=sum(p.samples for p in parts),
        coverage=float(np.mean([p.coverage for p in parts])),
        gap=any(p.gap for p in parts),
        estimated_share=float(np.mean([p.estimated_share for p in parts])),
        estimated=any(p.estimated for p in parts),
        fault=any(p.fault for p in parts),
    )


@dataclass(frozen=True)
class LocalClock:
    """Where UTC instants fall on the site's clock."""

    zone: ZoneInfo

    def offset_s(self, at: datetime) -> int:
        offset = at.astimezone(self.zone).utcoffset()
        return 0 if offset is None else int(offset.total_seconds())

    def day(self, at: datetime) -> date:
        return at.astimezone(self.zone).date()

    def minute(self, at: datetime, day: date) -> int:
        """Minutes on the clock from `day`'s local midnight to `at` (1440 at the next
        midnight): wall-clock minutes, so a daylight-saving day still ends at 1440."""
        wall = at.astimezone(self.zone).replace(tzinfo=None)
        return round((wall - datetime.combine(day, time(0))).total_seconds() / 60)


def fold(
    intervals: Sequence[MeterInterval], clock: LocalClock, interval_min: int
) -> list[MeterDay]:
    """The intervals (a complete UTC grid, oldest first) as the site's local days."""
    if not intervals:
        return []
    return local_days(
        [round(i.start.timestamp()) for i in intervals],
        [clock.offset_s(i.start) for i in intervals],
        [np.nan if i.mean_kw is None else i.mean_kw for i in intervals],
        interval_min=interval_min,
        estimated=[i.estimated for i in intervals],
    )
