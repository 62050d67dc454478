"""A meter-before rule in settlement (issue 38): an event settled against the site's level in
the seconds before its start, from the raw samples, worked out by hand below.

1-minute settlement intervals, the rule `meterbefore-60s` (the 60 s before the start, at most
10 s without a reading). Raw samples every second: 13:59:00-13:59:29 at 100 kW and
13:59:30-13:59:59 at 110 kW, so the level before the 14:00 start is 105 kW; three of them
(13:59:10-12) estimated, the last of those taken while the meter faulted. The event, 14:00 to
14:02, asks 40 kW; its minutes read 60 and 70 kW: 45 kW delivered (met) and 35 kW (not met),
(45 + 35) / 60 = 1.333 kWh, compliance 0.5. Meter after: the 60 s ending at 14:02 read 70 kW,
35 kW under the level before.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gateway.clock import SteppedClock
from gateway.services.settlement import Settlement
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import epoch_ms
from tests.gateway.test_settlement import EVENT_DAY, event_row, settings_for, write_day

START = datetime(2026, 11, 18, 14, tzinfo=UTC)
ESTIMATED = {70: (True, False), 71: (True, False), 72: (True, True)}  #: second: flags
MINUTE_KW = {840: 60.0, 841: 70.0}  #: the event's minutes


def before_kw(second: int) -> float:
    """13:59:00 + `second` (0 to 59) before the start; 14:01:00 + (`second` - 120) after."""
    if second >= 120:
        return 70.0
    return 100.0 if second < 30 else 110.0


def write_samples(store: Store, seconds: list[int]) -> None:
    """Raw samples at 13:59:00 + each second."""
    first = START - timedelta(seconds=60)
    rows = []
    for second in seconds:
        estimated, fault = ESTIMATED.get(60 + second, (False, False))
        at = first + timedelta(seconds=second)
        rows.append(
            {"at_ms": epoch_ms(at), "kw": before_kw(second), "estimated": estimated, "fault": fault}
        )
    with store.session() as s:
        repo.add_meter_samples(s, rows=rows)
        s.commit()


def settle_fast(
    database_url: str,
    *,
    seconds: list[int],
    now: datetime,
    source: str = "manual",
    rules: str | None = "meterbefore-60s",
    interval_min: int | None = 1,
) -> dict:
    store = Store(database_url)
    try:
        write_day(store, EVENT_DAY, lambda slot: MINUTE_KW.get(slot, 105.0), length_s=60)
        write_samples(store, seconds)
        event = event_row("ev-fast", START, 40.0, minutes=2)
        event.source = source
        with store.session() as s:
            repo.add_event(s, event=event)
            s.commit()
        settlement = Settlement(settings_for(database_url), store, SteppedClock(now))
        doc = asyncio.run(settlement.doc("ev-fast", rules=rules, interval_min=interval_min))
    finally:
        store.close()
    (rule,) = doc["rules"]
    return rule


EVERY_SECOND = [*range(60), *range(120, 180)]


def test_an_event_is_settled_against_the_level_before_its_start(database_url):
    rule = settle_fast(database_url, seconds=EVERY_SECOND, now=START + timedelta(hours=1))
    assert (rule["kind"], rule["parameters"]) == (
        "MeterBeforeRule",
        {"window_s": 60.0, "max_gap_s": 10.0},
    )
    assert rule["reason"] is None
    assert rule["meter_before"] == {
        "level_kw": 105.0,
        "start": "2026-11-18T13:59:00+00:00",
        "end": "2026-11-18T14:00:00+00:00",
        "samples": 60,
        "estimated_samples": 3,
        "fault_samples": 1,
    }
    assert rule["meter_after"]["level_kw"] == 70.0
    assert rule["meter_after"]["delivered_kw"] == 35.0
    assert rule["meter_after_reason"] is None
    assert rule["baseline"]["days_used"] == []
    rows = rule["intervals"]
    assert [r["baseline_kw"] for r in rows] == [105.0, 105.0]
    assert [r["metered_kw"] for r in rows] == [60.0, 70.0]
    assert [r["delivered_kw"] for r in rows] == [45.0, 35.0]
    assert [r["met"] for r in rows] == [True, False]
    assert rule["totals"]["delivered_kwh"] == pytest.approx(80 / 60, abs=1e-3)
    assert rule["totals"]["compliance"] == 0.5


def test_a_gap_before_the_trigger_gives_no_level_and_says_so(database_url):
    """13:59:20 to 13:59:39 missing: 21 s from the 13:59:19 sample to the 13:59:40 one."""
    seconds = [s for s in EVERY_SECOND if not 20 <= s < 40]
    rule = settle_fast(database_url, seconds=seconds, now=START + timedelta(hours=1))
    assert rule["baseline"] is None
    assert rule["meter_before"] is None
    assert rule["reason"].startswith("21 s without a reading in the 60 s before the trigger")
    assert [r["delivered_kw"] for r in rule["intervals"]] == [None, None]
    assert [r["metered_kw"] for r in rule["intervals"]] == [60.0, 70.0]
    assert rule["meter_after"]["level_kw"] == 70.0  # no level before: no kW delivered after
    assert "delivered_kw" not in rule["meter_after"]


def test_raw_samples_past_their_retention_are_said_to_be_gone(database_url):
    """Samples are kept FLEXGATE_METER_HISTORY_RAW_KEEP_S (7 days): settled 8 days later, the
    window's are gone, though these were never pruned, and the intervals still read."""
    rule = settle_fast(database_url, seconds=EVERY_SECOND, now=START + timedelta(days=8))
    assert rule["baseline"] is None
    assert rule["reason"] == (
        "the raw samples of 2026-11-18T13:59:00+00:00 to 2026-11-18T14:00:00+00:00 are gone: "
        "they are kept FLEXGATE_METER_HISTORY_RAW_KEEP_S (604800 s), from "
        "2026-11-19T14:00:00+00:00 now"
    )
    assert rule["meter_after_reason"].startswith("the raw samples of 2026-11-18T14:01:00")
    assert [r["metered_kw"] for r in rule["intervals"]] == [60.0, 70.0]


def test_the_settings_take_a_meter_before_rule_and_refuse_a_malformed_one():
    settings = settings_for("sqlite:///x.db", settlement_rules="10of10,meterbefore-60s")
    assert settings.settlement_rule_names == ("10of10", "meterbefore-60s")
    with pytest.raises(ValueError, match="FLEXGATE_SETTLEMENT_RULES: 'meterbefore-60'"):
        settings_for("sqlite:///x.db", settlement_rules="meterbefore-60")


def test_a_fast_event_is_settled_by_default_on_the_level_before_its_trigger(database_url):
    """A fast event (source `fast`) asked for no rules is settled under
    FLEXGATE_FAST_SETTLEMENT_RULES (`meterbefore-30s`) in FLEXGATE_FAST_SETTLEMENT_INTERVAL_MIN
    (1) minute intervals: the 30 s before 14:00 read 110 kW, so 50 and 40 kW delivered; the same
    event from any other source goes by the site's program rules (the 15-minute interval from
    14:00 holds both minutes)."""
    rule = settle_fast(
        database_url,
        seconds=EVERY_SECOND,
        now=START + timedelta(hours=1),
        source="fast",
        rules=None,
        interval_min=None,
    )
    assert rule["rule"] == "meterbefore-30s"
    assert rule["meter_before"]["level_kw"] == 110.0
    assert [r["delivered_kw"] for r in rule["intervals"]] == [50.0, 40.0]
    settings = settings_for("sqlite:///x.db")
    assert settings.settles_with("fast") == (("meterbefore-30s",), 1)
    assert settings.settles_with("openadr") == (("10of10", "sameday-3+2"), 15)


def test_fast_settlement_settings_are_checked_at_load():
    with pytest.raises(ValueError, match="FLEXGATE_FAST_SETTLEMENT_RULES: 'before-30s'"):
        settings_for("sqlite:///x.db", fast_settlement_rules="before-30s")
    with pytest.raises(ValueError, match="FLEXGATE_FAST_SETTLEMENT_INTERVAL_MIN"):
        settings_for("sqlite:///x.db", fast_settlement_interval_min=7)
