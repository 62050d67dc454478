"""`flexgate replay` (issue 38, item 6): days of a site's history synthesised into a gateway
store, events run through the gateway's loop on a simulated site, the days settled and
reported. A short replay here (14 days, 3 events, 5-minute history); the month's is
docs/operations.md's example."""

from __future__ import annotations

import csv
import json
from datetime import date
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from flexgate.cli import main
from flexgate.lab.loadshape import LoadShape
from flexgate.replay import ReplayError, default_holiday, draw_events
from gateway.store import repo
from gateway.store.db import Store


def test_a_short_replay_settles_its_events_near_what_they_delivered(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["replay", "--days", "14", "--events", "3", "--resolution-s", "300", "--nodes", "1"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["first_day"], doc["last_day"], doc["holiday"]) == (
        "2026-06-01",
        "2026-06-14",
        "2026-06-08",
    )
    assert doc["html"] == str(out / "settlement-2026-06-01-2026-06-14.html")
    assert [e["event_id"] for e in doc["events"]] == ["replay-01", "replay-02", "replay-03"]
    for event in doc["events"]:
        made = event["replay"]
        assert made["delivered_kwh"] > 0
        # the loop held the reduction asked, on average, within 10%
        assert abs(made["mean_delivered_kw"] / made["requested_kw"] - 1) < 0.1
        ten = event["rules"]["10of10"]
        assert ten["reason"] is None
        # the adjusted 10-of-10 baseline counts what the replay made it deliver, within 10%
        assert abs(ten["delivered_kwh"] / made["delivered_kwh"] - 1) < 0.1
        assert date.fromisoformat(event["event_day"]).weekday() < 5
    with open(doc["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == doc["rows"] > 0
    assert {r["event_id"] for r in rows} == {"replay-01", "replay-02", "replay-03"}
    page = (out / "settlement-2026-06-01-2026-06-14.html").read_text()
    assert page.count("<svg") == 3
    store = Store(f"sqlite:///{doc['database']}")
    try:
        with store.session() as s:
            assert {e.status for e in repo.list_events(s)} == {"completed"}
    finally:
        store.close()


def test_more_events_than_weekdays_an_unknown_preset_or_zone_are_bad_input(tmp_path, capsys):
    argv = ["replay", "--days", "3", "--events", "5", "--start", "2026-06-05"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "5 events need as many weekdays; 3 days hold 1" in capsys.readouterr().err
    assert main(["replay", "--rules", "9of9", "--out", str(tmp_path)]) == 2
    assert "'9of9' is not a baseline preset" in capsys.readouterr().err
    assert main(["replay", "--timezone", "Mars/Base", "--out", str(tmp_path)]) == 2
    assert "no time zone 'Mars/Base'" in capsys.readouterr().err


def test_events_fall_on_distinct_weekdays_in_the_afternoon_and_the_holiday_is_kept():
    zone = ZoneInfo("America/New_York")
    days = [date(2026, 6, d) for d in range(1, 31)]
    holiday = default_holiday(days[0], 30)
    assert holiday == date(2026, 6, 16)
    shape = LoadShape(cluster_kw=100.0, other_kw=25.0, zone=zone, holidays=frozenset({holiday}))
    events = draw_events(days, 10, shape=shape, rng=np.random.default_rng(3))
    local = [e.start.astimezone(zone) for e in events]
    assert len({t.date() for t in local}) == 10
    assert all(t.weekday() < 5 and t.date() != holiday for t in local)
    assert all(13 <= t.hour <= 16 and t.minute % 15 == 0 for t in local)
    assert all(10.0 <= e.reduction_kw <= 25.0 for e in events)
    assert shape.kw(local[0]) > shape.kw(local[0].replace(hour=3))  # the afternoon peak
    with pytest.raises(ReplayError, match="3 events need as many weekdays"):
        draw_events(days[:2], 3, shape=shape, rng=np.random.default_rng(3))
