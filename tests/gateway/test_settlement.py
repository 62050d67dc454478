"""Per-event settlement (issue 38, item 3): an event settled under the program's baselines
from the meter history, worked out by hand below.

The site's history (UTC, 15-minute intervals): weekdays 100 kW all day; weekends 300 kW; the
holiday 2026-11-11 and the other event's day 2026-11-16 500 kW (both left out, or the
baseline would show it). The event day, Wednesday 2026-11-18: 110 kW, and in the event
(14:00-15:00, 35 kW asked) 70, 70, 80, 70 kW; the 14:15 interval estimated, the 14:30 one
taken while the meter faulted.

- 10of10: the 10 newest eligible weekdays (12 in the 20 days written, less the holiday and
  the event day) average 100 kW; the adjustment window (10:00-13:00) reads 110 against 100:
  a factor 1.1, inside the 20% cap, so 110 kW.
- sameday-3+2: 11:00-14:00 and 15:00-17:00 read 110 kW: 110 kW.

Either way 40, 40, 30, 40 kW delivered against 35: three of four intervals met (compliance
0.75), 37.5 kWh (mean 37.5 kW) against 35 kWh."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta

import pytest
from pydantic import ValidationError

from gateway.clock import SteppedClock
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.services.settlement import Settlement
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow, epoch_ms
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN
from tests.gateway.test_meter_history import running_gateway

EVENT_DAY = date(2026, 11, 18)
HOLIDAY = date(2026, 11, 11)
OTHER_EVENT_DAY = date(2026, 11, 16)
START = datetime.combine(EVENT_DAY, time(14), tzinfo=UTC)
IN_EVENT_KW = {56: 70.0, 57: 70.0, 58: 80.0, 59: 70.0}  #: the event's 15-minute slots
FLAGS = {57: (True, False), 58: (True, True)}  #: slot: (estimated, fault)


def settings_for(database_url: str, **changes) -> GatewaySettings:
    return GatewaySettings(
        database_url=database_url, api_token=API_TOKEN, agent_token=AGENT_TOKEN, **changes
    )


def history_kw(day: date) -> Callable[[int], float]:
    """The load of each 15-minute slot of a day before the event's."""
    if day in (HOLIDAY, OTHER_EVENT_DAY):
        return lambda slot: 500.0
    if day.weekday() >= 5:
        return lambda slot: 300.0
    return lambda slot: 100.0


def interval_row(
    length_s: int, start_ms: int, kw: float, *, estimated: bool = False, fault: bool = False
) -> dict:
    """One closed interval, as the meter history rolls it up (a sample every 5 s)."""
    return {
        "length_s": length_s,
        "start_ms": start_ms,
        "mean_kw": kw,
        "samples": length_s // 5,
        "coverage": 1.0,
        "gap": False,
        "estimated_share": 1.0 if estimated else 0.0,
        "estimated": estimated,
        "fault": fault,
    }


def write_day(
    store: Store,
    day: date,
    kw: Callable[[int], float],
    *,
    length_s: int = 900,
    flags: dict[int, tuple[bool, bool]] | None = None,
) -> None:
    """A UTC day of intervals of `length_s`, as the meter history rolls them up."""
    begins = epoch_ms(datetime.combine(day, time(0), tzinfo=UTC))
    count = 86400 // length_s
    rows = []
    for slot in range(count):
        estimated, fault = (flags or {}).get(slot, (False, False))
        start_ms = begins + slot * length_s * 1000
        rows.append(interval_row(length_s, start_ms, kw(slot), estimated=estimated, fault=fault))
    with store.session() as s:
        repo.replace_meter_intervals(
            s, length_s=length_s, start_ms=begins, end_ms=begins + 86400_000, rows=rows
        )
        s.commit()


def event_row(event_id: str, start: datetime, reduction_kw: float, minutes: int = 60) -> EventRow:
    end = start + timedelta(minutes=minutes)
    return EventRow(
        id=event_id,
        source="manual",
        status="completed",
        start=start,
        end=end,
        reduction_kw=reduction_kw,
        intervals=[
            {"start": start.isoformat(), "end": end.isoformat(), "reduction_kw": reduction_kw}
        ],
        created_at=start - timedelta(hours=1),
    )


def write_site(store: Store, *, history_days: int = 20) -> None:
    """The history, the event day and the two events (module docstring)."""
    for back in range(1, history_days + 1):
        day = EVENT_DAY - timedelta(days=back)
        write_day(store, day, history_kw(day))
    write_day(store, EVENT_DAY, lambda slot: IN_EVENT_KW.get(slot, 110.0), flags=FLAGS)
    with store.session() as s:
        repo.add_event(s, event=event_row("ev-1", START, 35.0))
        other = datetime.combine(OTHER_EVENT_DAY, time(15), tzinfo=UTC)
        repo.add_event(s, event=event_row("ev-0", other, 20.0))
        s.commit()


def settle(database_url: str, event_id: str = "ev-1", *, history_days: int = 20, **query):
    settings = settings_for(database_url, settlement_holidays=HOLIDAY.isoformat())
    store = Store(database_url)
    try:
        write_site(store, history_days=history_days)
        settlement = Settlement(settings, store, SteppedClock(datetime(2026, 12, 1, tzinfo=UTC)))
        return asyncio.run(settlement.doc(event_id, **query))
    finally:
        store.close()


def test_an_event_is_settled_under_each_rule_as_worked_out_by_hand(database_url):
    doc = settle(database_url)
    assert (doc["event_day"], doc["interval_min"], doc["timezone"]) == ("2026-11-18", 15, "UTC")
    assert doc["event_days_excluded"] == ["2026-11-16"]
    assert [r["rule"] for r in doc["rules"]] == ["10of10", "sameday-3+2"]
    ten, same = doc["rules"]
    weekdays = [date(2026, 11, d) for d in (17, 13, 12, 10, 9, 6, 5, 4, 3, 2)]
    assert ten["reason"] is None
    assert ten["baseline"] == {
        "days_used": [d.isoformat() for d in weekdays],
        "adjustment_factor": pytest.approx(1.1),
        "adjustment_kw": 0.0,
        "capped": False,
        "adjusted": True,
    }
    assert same["baseline"]["days_used"] == ["2026-11-18"]
    for rule in (ten, same):
        rows = rule["intervals"]
        assert [r["start"] for r in rows] == [
            (START + timedelta(minutes=15 * i)).isoformat() for i in range(4)
        ]
        assert [r["baseline_kw"] for r in rows] == [110.0] * 4
        assert [r["metered_kw"] for r in rows] == [70.0, 70.0, 80.0, 70.0]
        assert [r["delivered_kw"] for r in rows] == [40.0, 40.0, 30.0, 40.0]
        assert [r["delivered_kwh"] for r in rows] == pytest.approx([10.0, 10.0, 7.5, 10.0])
        assert [r["target_kw"] for r in rows] == [35.0] * 4
        assert [r["met"] for r in rows] == [True, True, False, True]
        assert [(r["estimated"], r["fault"]) for r in rows] == [
            (False, False),
            (True, False),
            (True, True),
            (False, False),
        ]
        totals = rule["totals"]
        assert totals["compliance"] == 0.75
        assert (totals["intervals"], totals["intervals_met"]) == (4, 3)
        assert totals["delivered_kwh"] == pytest.approx(37.5)
        assert totals["mean_delivered_kw"] == pytest.approx(37.5)
        assert (totals["target_kwh"], totals["mean_target_kw"]) == (35.0, 35.0)
        assert totals["estimated_intervals"] == [rows[1]["start"], rows[2]["start"]]
        assert totals["fault_intervals"] == [rows[2]["start"]]
        assert totals["unsettled_intervals"] == []


def test_a_rule_short_of_eligible_days_gives_its_reason_and_the_others_settle(database_url):
    """Six days written: Thursday, Friday, the weekend, the other event's Monday, Tuesday:
    three eligible days, ten needed. Weekend days of the 45 looked back over are of the other
    day type, whether written or not."""
    ten, same = settle(database_url, history_days=6)["rules"]
    assert ten["baseline"] is None
    assert ten["reason"].startswith("3 eligible days, 10 needed")
    # the 45 days looked back over: the rest have no meter history
    assert ten["reason"].endswith(
        "(45 days in the 45 before 2026-11-18: 1 event days, 14 other day type, 27 incomplete)"
    )
    assert [r["baseline_kw"] for r in ten["intervals"]] == [None] * 4
    assert [r["metered_kw"] for r in ten["intervals"]] == [70.0, 70.0, 80.0, 70.0]
    assert ten["totals"]["compliance"] == 0.0
    assert ten["totals"]["delivered_kwh"] is None
    assert len(ten["totals"]["unsettled_intervals"]) == 4
    assert same["reason"] is None
    assert same["totals"]["compliance"] == 0.75


def test_hour_intervals_are_made_of_the_half_hours(database_url):
    """60 minutes from the 30-minute history: 14:00 reads 70, 14:30 reads 80: 75 kW metered
    against 110 kW (same day), 35 kW delivered, the target met exactly."""
    store = Store(database_url)
    try:
        write_day(
            store,
            EVENT_DAY,
            lambda slot: {28: 70.0, 29: 80.0}.get(slot, 110.0),
            length_s=1800,
            flags={29: (True, False)},
        )
        with store.session() as s:
            repo.add_event(s, event=event_row("ev-1", START, 35.0))
            s.commit()
        settlement = Settlement(settings_for(database_url), store, SteppedClock(START))
        doc = asyncio.run(settlement.doc("ev-1", rules="sameday-3+2", interval_min=60))
    finally:
        store.close()
    (rule,) = doc["rules"]
    (row,) = rule["intervals"]
    assert (row["baseline_kw"], row["metered_kw"], row["delivered_kw"]) == (110.0, 75.0, 35.0)
    assert (row["met"], row["estimated"], row["estimated_share"]) == (True, True, 0.5)


def test_a_site_clock_east_of_utc_moves_the_event_day_and_its_windows(database_url):
    """Europe/Berlin in November is UTC+1: the event at 14:00 UTC is at 15:00 on the site's
    clock, and the same-day windows (12:00-15:00, 16:00-18:00 local) are 11:00-14:00 and
    15:00-17:00 UTC, all 110 kW."""
    settings = settings_for(database_url, site_timezone="Europe/Berlin")
    store = Store(database_url)
    try:
        write_site(store)
        settlement = Settlement(settings, store, SteppedClock(START))
        doc = asyncio.run(settlement.doc("ev-1", rules="sameday-3+2"))
    finally:
        store.close()
    (rule,) = doc["rules"]
    assert rule["reason"] is None
    assert [r["delivered_kw"] for r in rule["intervals"]] == [40.0, 40.0, 30.0, 40.0]


def test_an_unknown_event_and_bad_parameters_are_refused_by_name(database_url):
    store = Store(database_url)
    settlement = Settlement(settings_for(database_url), store, SteppedClock(START))
    try:
        write_site(store, history_days=1)
        with pytest.raises(NotFoundError, match="no event 'nope'"):
            asyncio.run(settlement.doc("nope"))
        with pytest.raises(InvalidRequestError, match=r"^rules: preset '9of9'"):
            asyncio.run(settlement.doc("ev-1", rules="9of9"))
        with pytest.raises(InvalidRequestError, match=r"^interval_min: 7 is not one of"):
            asyncio.run(settlement.doc("ev-1", interval_min=7))
    finally:
        store.close()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"settlement_rules": "10of10,9of9"}, "FLEXGATE_SETTLEMENT_RULES: '9of9'"),
        ({"site_timezone": "Mars/Olympus"}, "FLEXGATE_SITE_TIMEZONE: 'Mars/Olympus'"),
        ({"settlement_interval_min": 10}, "FLEXGATE_SETTLEMENT_INTERVAL_MIN: 10"),
        ({"settlement_holidays": "2026-11-26,26/12/2026"}, "FLEXGATE_SETTLEMENT_HOLIDAYS: '26/"),
        (
            {"site_timezone": "Asia/Kathmandu", "settlement_interval_min": 30},
            "FLEXGATE_SITE_TIMEZONE: Asia/Kathmandu's offset",
        ),
    ],
)
def test_bad_settlement_settings_are_refused_naming_the_setting(changes, named):
    with pytest.raises(ValidationError, match=named):
        settings_for("sqlite:///x.db", **changes)


def site_database(tmp_path) -> str:
    """A SQLite store in `tmp_path` with the site's meter history and events written: its URL."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    store = Store(database_url)
    try:
        write_site(store)
    finally:
        store.close()
    return database_url


def test_the_settlement_is_served_and_linked_from_the_event(tmp_path):
    database_url = site_database(tmp_path)
    options = {"settlement_holidays": HOLIDAY.isoformat()}
    with running_gateway(tmp_path, database_url, **options) as (api, _):
        event = api.get("/v1/events/ev-1").json()
        assert event["settlement"] == {
            "href": "/v1/events/ev-1/settlement",
            "rules": ["10of10", "sameday-3+2"],
            "interval_min": 15,
            "timezone": "UTC",
        }
        answer = api.get(event["settlement"]["href"])
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        assert [r["totals"]["compliance"] for r in doc["rules"]] == [0.75, 0.75]
        assert [r["totals"]["delivered_kwh"] for r in doc["rules"]] == pytest.approx([37.5, 37.5])
        one = api.get("/v1/events/ev-1/settlement", params={"rules": "high5of10"}).json()
        # high 5 of 10: five 100 kW days, additive (+10 kW): 110 kW as well
        assert one["rules"][0]["baseline"]["adjustment_kw"] == pytest.approx(10.0)
        missing = api.get("/v1/events/nope/settlement")
        assert missing.status_code == 404, missing.text
        assert missing.json()["detail"] == "no event 'nope'"
        for params, named in (
            ({"rules": "9of9"}, "rules"),
            ({"interval_min": 2}, "interval_min"),
            ({"interval_min": "x"}, "interval_min"),
        ):
            bad = api.get("/v1/events/ev-1/settlement", params=params)
            assert bad.status_code == 422, bad.text
            assert named in str(bad.json()["detail"]), bad.text


def test_the_repeated_hour_of_a_fall_back_day_is_folded_onto_the_site_clock(database_url):
    """America/New_York falls back on Sunday 2026-11-01: 01:00-02:00 happens twice (05:00 and
    06:00 UTC). The event, 08:00-09:00 UTC, is 03:00-04:00 on the site's clock. Same day: the
    3 h before it on the clock, 00:00-03:00, are twelve intervals, the repeated four holding
    the mean of both occurrences (120 and 160 kW: 140); with 100 kW elsewhere and the 2 h
    after at 100, the baseline is (4 x 100 + 4 x 140 + 4 x 100 + 8 x 100) / 20 = 108 kW."""
    loads = {**dict.fromkeys(range(20, 24), 120.0), **dict.fromkeys(range(24, 28), 160.0)}
    loads |= dict.fromkeys(range(32, 36), 50.0)
    store = Store(database_url)
    try:
        write_day(store, date(2026, 11, 1), lambda slot: loads.get(slot, 100.0))
        write_day(store, date(2026, 11, 2), lambda slot: 100.0)
        with store.session() as s:
            start = datetime(2026, 11, 1, 8, tzinfo=UTC)
            repo.add_event(s, event=event_row("ev-dst", start, 50.0))
            s.commit()
        settings = settings_for(database_url, site_timezone="America/New_York")
        settlement = Settlement(settings, store, SteppedClock(START))
        doc = asyncio.run(settlement.doc("ev-dst", rules="sameday-3+2"))
    finally:
        store.close()
    (rule,) = doc["rules"]
    assert doc["event_day"] == "2026-11-01"
    assert [r["baseline_kw"] for r in rule["intervals"]] == [108.0] * 4
    assert [r["delivered_kw"] for r in rule["intervals"]] == [58.0] * 4
    assert rule["totals"]["compliance"] == 1.0
