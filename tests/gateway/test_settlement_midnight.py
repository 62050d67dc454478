"""An event across the site's midnight, settled day part by day part (issue 38), worked out by
hand below.

The site is in Europe/Berlin (UTC+1 in November; its clock fell back on Sunday 2026-10-25, a
day of the history), 15-minute intervals. The event runs from Friday 2026-11-20 23:00 to
Saturday 01:00 local (22:00-00:00 UTC), 30 kW asked. The history: weekdays 100 kW, weekends
60 kW, the holiday Wednesday 2026-11-11 80 kW; another event on Sunday 2026-11-08. The Friday:
100 kW, 110 kW from 19:00 to 23:00, 80 kW in the event. The Saturday: 35 kW in the event,
50 kW from 01:00 to 03:00, 60 kW after.

- 10of10, Friday's part (23:00-24:00): the ten newest eligible weekdays (19, 18, 17, 16, 13,
  12, 10, 9, 6, 5 November; the holiday is of the other type) read 100 kW; the adjustment
  window, 19:00-22:00 on the Friday, reads 110: a factor 1.1, so 110 kW. Delivered 30 kW.
- 10of10, Saturday's part (00:00-01:00), judged on its own day: the ten newest weekend days
  and holidays before it, the other event's Sunday left out: 15, 14, 11 (the holiday, 80 kW),
  7, 1 November, 31, 25, 24, 18, 17 October, (9 x 60 + 80) / 10 = 62 kW; the event's day-of
  adjustment (1.1, from the hours before its start) gives 68.2 kW, inside the 20% cap.
  Delivered 68.2 - 35 = 33.2 kW. All eight intervals met; 4 x 30 / 4 + 4 x 33.2 / 4 = 63.2 kWh.
- sameday-3+2: one level for the whole event, from the 3 h before its start (Friday
  20:00-23:00, 110 kW) and the 2 h after its end (Saturday 01:00-03:00, 50 kW): (12 x 110 +
  8 x 50) / 20 = 86 kW. Delivered 6 kW on the Friday (not met), 51 kW on the Saturday (met).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gateway.clock import SteppedClock
from gateway.services.meterdays import local_midnight
from gateway.services.settlement import Settlement
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import epoch_ms
from tests.gateway.test_settlement import event_row, interval_row, settings_for

ZONE = ZoneInfo("Europe/Berlin")
FRIDAY, SATURDAY = date(2026, 11, 20), date(2026, 11, 21)
HOLIDAY, OTHER_EVENT_DAY = date(2026, 11, 11), date(2026, 11, 8)
START = datetime(2026, 11, 20, 22, tzinfo=UTC)  #: 23:00 on the site's clock


def load_kw(local: datetime) -> float:
    """The site's load in the 15 minutes from `local` (module docstring)."""
    day, hour = local.date(), local.hour
    if day == FRIDAY:
        return 80.0 if hour == 23 else 110.0 if hour >= 19 else 100.0
    if day == SATURDAY:
        return 35.0 if hour == 0 else 50.0 if hour < 3 else 60.0
    if day == HOLIDAY:
        return 80.0
    return 60.0 if day.weekday() >= 5 else 100.0


#: The night the clock falls back: Saturday 2026-10-24 23:00 to Sunday 03:00 local (21:00 to
#: 02:00 UTC, five hours: 02:00-03:00 happens twice, 00:00-01:00 UTC in summer time and
#: 01:00-02:00 UTC in winter time).
DST_START = datetime(2026, 10, 24, 21, tzinfo=UTC)


def dst_night_kw(local: datetime) -> float:
    """Saturday 20:00-23:00 100 kW, the event 70 kW, Sunday 03:00-05:00 80 kW; else 60."""
    day, hour = local.date(), local.hour
    if day == date(2026, 10, 24) and hour >= 20:
        return 70.0 if hour == 23 else 100.0
    if day == date(2026, 10, 25) and hour < 5:
        return 70.0 if hour < 3 else 80.0
    return 60.0


def write_history(store: Store, load=load_kw, last_day: date = SATURDAY) -> None:
    """Every 15 minutes from 2026-10-01 to the end of `last_day`, on the site's clock."""
    begins = local_midnight(date(2026, 10, 1), ZONE)
    ends = local_midnight(last_day + timedelta(days=1), ZONE)
    rows = []
    at = begins
    while at < ends:
        rows.append(interval_row(900, epoch_ms(at), load(at.astimezone(ZONE))))
        at += timedelta(minutes=15)
    with store.session() as s:
        repo.replace_meter_intervals(
            s, length_s=900, start_ms=epoch_ms(begins), end_ms=epoch_ms(ends), rows=rows
        )
        s.commit()


def settle(database_url: str, event_id: str, **query) -> dict:
    settings = settings_for(
        database_url, site_timezone="Europe/Berlin", settlement_holidays=HOLIDAY.isoformat()
    )
    store = Store(database_url)
    try:
        if event_id == "ev-dst":
            write_history(store, dst_night_kw, date(2026, 10, 25))
            event = event_row(event_id, DST_START, 20.0, minutes=300)
        else:
            write_history(store)
            event = event_row(event_id, START, 30.0, minutes=120)
        with store.session() as s:
            repo.add_event(s, event=event)
            other = datetime(2026, 11, 8, 14, tzinfo=UTC)
            repo.add_event(s, event=event_row("ev-0", other, 20.0))
            s.commit()
        settlement = Settlement(settings, store, SteppedClock(datetime(2026, 12, 1, tzinfo=UTC)))
        return asyncio.run(settlement.doc(event_id, **query))
    finally:
        store.close()


@pytest.fixture
def settled(database_url) -> dict:
    return settle(database_url, "ev-night")


def days(*dates: tuple[int, int]) -> list[str]:
    return [date(2026, month, day).isoformat() for month, day in dates]


def test_each_day_of_an_event_across_midnight_is_settled_on_its_own_baseline(settled):
    assert (settled["event_day"], settled["timezone"]) == ("2026-11-20", "Europe/Berlin")
    assert settled["event_days_excluded"] == ["2026-11-08"]
    ten = settled["rules"][0]
    assert (ten["rule"], ten["reason"]) == ("10of10", None)
    rows = ten["intervals"]
    assert [r["start"] for r in rows] == [
        (START + timedelta(minutes=15 * k)).isoformat() for k in range(8)
    ]
    assert [r["baseline_kw"] for r in rows] == pytest.approx([110.0] * 4 + [68.2] * 4)
    assert [r["unadjusted_baseline_kw"] for r in rows] == pytest.approx([100.0] * 4 + [62.0] * 4)
    assert [r["metered_kw"] for r in rows] == [80.0] * 4 + [35.0] * 4
    assert [r["delivered_kw"] for r in rows] == pytest.approx([30.0] * 4 + [33.2] * 4)
    assert all(r["met"] for r in rows)
    assert ten["totals"]["delivered_kwh"] == pytest.approx(63.2)
    assert ten["totals"]["compliance"] == 1.0
    friday = days(*((11, d) for d in (19, 18, 17, 16, 13, 12, 10, 9, 6, 5)))
    saturday = days(
        *((11, d) for d in (15, 14, 11, 7, 1)), *((10, d) for d in (31, 25, 24, 18, 17))
    )
    baseline = ten["baseline"]
    assert baseline["days_used"] == friday  # the first day's figures, then each day's
    assert baseline["adjustment_factor"] == pytest.approx(1.1)
    parts = baseline["parts"]
    assert [(p["day"], p["start_min"], p["end_min"], p["reason"]) for p in parts] == [
        ("2026-11-20", 1380, 1440, None),
        ("2026-11-21", 0, 60, None),
    ]
    assert [p["baseline"]["days_used"] for p in parts] == [friday, saturday]
    assert [p["baseline"]["adjustment_factor"] for p in parts] == pytest.approx([1.1, 1.1])
    assert [p["baseline"]["capped"] for p in parts] == [False, False]


def test_a_same_day_level_across_midnight_is_read_before_the_start_and_after_the_end(settled):
    same = settled["rules"][1]
    assert (same["rule"], same["reason"]) == ("sameday-3+2", None)
    rows = same["intervals"]
    assert [r["baseline_kw"] for r in rows] == [86.0] * 8
    assert [r["delivered_kw"] for r in rows] == [6.0] * 4 + [51.0] * 4
    assert [r["met"] for r in rows] == [False] * 4 + [True] * 4
    assert same["totals"]["compliance"] == 0.5
    assert same["baseline"]["days_used"] == ["2026-11-21", "2026-11-20"]


def test_the_night_the_clock_falls_back_is_settled_interval_by_interval(database_url):
    """Same day: 3 h before 23:00 on the Saturday (100 kW) and 2 h after 03:00 on the Sunday
    (80 kW): (12 x 100 + 8 x 80) / 20 = 92 kW. Twenty intervals in five hours, the repeated
    hour's eight included, each 92 - 70 = 22 kW delivered: 110 kWh."""
    doc = settle(database_url, "ev-dst", rules="sameday-3+2")
    (same,) = doc["rules"]
    assert same["reason"] is None
    rows = same["intervals"]
    assert len(rows) == 20
    assert rows[-1]["end"] == "2026-10-25T02:00:00+00:00"
    assert [r["baseline_kw"] for r in rows] == [92.0] * 20
    assert [r["delivered_kw"] for r in rows] == [22.0] * 20
    assert same["totals"]["delivered_kwh"] == pytest.approx(110.0)
    parts = same["baseline"]["parts"]
    assert [(p["day"], p["start_min"], p["end_min"]) for p in parts] == [
        ("2026-10-24", 1380, 1440),
        ("2026-10-25", 0, 180),
    ]
