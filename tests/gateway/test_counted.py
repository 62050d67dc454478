"""Before an event (issue 38, item 4): what the utility would count of a quote and of an
opt-in, under the program's baseline, from meter history in a real store, worked by hand.

The history is test_settlement's (UTC, 15-minute intervals): weekdays 100 kW, the holiday and
the other event's day left out; the event day, Wednesday 2026-11-18, 110 kW until the event
(14:00-15:00). Seen at 13:30, the readings from then on have not happened.

- 10of10: the ten newest eligible weekdays average 100 kW; the adjustment window
  (10:00-13:00) reads 110: a factor 1.1, inside the 20% cap: 110 kW in each interval.
- A site at 90 kW now runs 20 kW below that baseline: a 35 kW shed leaves it at 55 kW, and the
  utility counts 110 - 55 = 55 kW; 30 kW firm counts 50, 40 kW achievable 60.
- A site at 130 kW runs 20 kW above: the 35 kW shed counts 110 - 95 = 15 kW.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, time, timedelta

import pytest
from pydantic import ValidationError

from gateway.clock import SteppedClock
from gateway.services.counted import Counted
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import epoch_ms
from tests.gateway.conftest import API, running_site
from tests.gateway.test_meter_history import running_gateway
from tests.gateway.test_settlement import (
    HOLIDAY,
    START,
    interval_row,
    settings_for,
    site_database,
    write_site,
)
from tests.gateway.test_settlement_midnight import HOLIDAY as NIGHT_HOLIDAY
from tests.gateway.test_settlement_midnight import START as NIGHT
from tests.gateway.test_settlement_midnight import write_history
from tests.gateway.test_ven import Vtn

SHEDS = {"reduction_kw": 35.0, "firm_kw": 30.0, "achievable_kw": 40.0}
BEFORE = START - timedelta(minutes=30)  #: 13:30, half an hour before the event


def count(database_url, rule, level_kw, *, now=BEFORE, history_days=20, **changes):
    settings = settings_for(database_url, settlement_holidays=HOLIDAY.isoformat(), **changes)
    store = Store(database_url)
    try:
        write_site(store, history_days=history_days)
        counted = Counted(settings, store, SteppedClock(now), power=None)  # type: ignore[arg-type]
        level = {"kw": level_kw, "source": "meter", "estimated": False}
        end = START + timedelta(hours=1)
        return asyncio.run(counted.doc(rule, START, end, dict(SHEDS), level))
    finally:
        store.close()


def test_a_site_below_its_baseline_days_is_counted_more_than_it_sheds(database_url):
    doc = count(database_url, "10of10", 90.0)
    assert doc["reason"] is None
    assert (doc["start"], doc["end"]) == (
        START.isoformat(),
        (START + timedelta(hours=1)).isoformat(),
    )
    assert [r["baseline_kw"] for r in doc["intervals"]] == [110.0] * 4
    assert doc["baseline_kw"] == 110.0
    assert doc["baseline"]["adjustment_factor"] == pytest.approx(1.1)
    assert doc["below_baseline_kw"] == 20.0
    assert doc["counted_kw"] == {"reduction_kw": 55.0, "firm_kw": 50.0, "achievable_kw": 60.0}
    assert doc["level"] == {"kw": 90.0, "source": "meter", "estimated": False}


def test_a_site_above_its_baseline_days_is_counted_less_than_it_sheds(database_url):
    doc = count(database_url, "10of10", 130.0)
    assert doc["below_baseline_kw"] == -20.0
    assert doc["counted_kw"] == {"reduction_kw": 15.0, "firm_kw": 10.0, "achievable_kw": 20.0}


@pytest.mark.parametrize(
    ("rule", "now", "history_days", "why"),
    [
        ("sameday-3+2", BEFORE, 20, "it gives no baseline before the event"),
        ("meterbefore-60s", BEFORE, 20, "60 s before the trigger: it gives no baseline"),
        # the adjustment window ends at 13:00: at 12:30 it has not happened
        ("10of10", START - timedelta(minutes=90), 20, "day-of adjustment (3 h ending 1 h"),
        ("10of10", BEFORE, 6, "3 eligible days, 10 needed"),
    ],
)
def test_a_rule_that_cannot_give_a_baseline_before_the_event_says_why(
    database_url, rule, now, history_days, why
):
    doc = count(database_url, rule, 90.0, now=now, history_days=history_days)
    assert why in doc["reason"]
    assert (doc["baseline_kw"], doc["intervals"]) == (None, [])
    assert doc["counted_kw"] == dict.fromkeys(SHEDS)


@pytest.mark.parametrize(
    ("rule", "now", "why"),
    [
        # 13:05: the adjustment window (10:00-13:00) has happened; high 5 of 10, additive +10
        ("high5of10", datetime(2026, 11, 18, 13, 5, tzinfo=UTC), None),
        # 12:00: the match window (10:00-13:00) has not
        ("matchday-3", datetime(2026, 11, 18, 12, tzinfo=UTC), "match window"),
    ],
)
def test_a_window_before_the_start_counts_once_it_has_happened(database_url, rule, now, why):
    doc = count(database_url, rule, 90.0, now=now)
    if why is None:
        assert (doc["reason"], doc["baseline_kw"]) == (None, 110.0)
    else:
        assert why in doc["reason"]


def test_an_unknown_opt_in_baseline_is_a_settings_error():
    with pytest.raises(ValidationError, match="FLEXGATE_OPT_IN_BASELINE: '9of9'"):
        settings_for("sqlite:///x.db", opt_in_baseline="9of9")


def test_a_quote_names_the_baseline_and_shows_what_would_be_counted(tmp_path):
    database_url = site_database(tmp_path)
    options = {"settlement_holidays": HOLIDAY.isoformat()}
    with running_gateway(tmp_path, database_url, **options) as (api, _):
        plain = api.post("/v1/quotes", json={"reduction_kw": 1.0})
        assert plain.status_code == 200, plain.text
        assert "counted" not in plain.json()
        body = {"reduction_kw": 1.0, "baseline": "10of10", "start": START.isoformat()}
        answer = api.post("/v1/quotes", json=body)
        assert answer.status_code == 200, answer.text
        quote = answer.json()
        counted = quote["counted"]
        assert (counted["rule"], counted["reason"]) == ("10of10", None)
        assert [r["baseline_kw"] for r in counted["intervals"]] == [110.0] * 4
        level_kw = counted["level"]["kw"]
        assert counted["level"]["estimated"] is True  # no meter: the estimate
        assert counted["below_baseline_kw"] == pytest.approx(110.0 - level_kw, abs=1e-3)
        assert counted["counted_kw"]["reduction_kw"] == pytest.approx(111.0 - level_kw, abs=2e-3)
        assert counted["counted_kw"]["firm_kw"] == pytest.approx(
            110.0 - level_kw + quote["firm_kw"], abs=2e-3
        )
        for bad, named in (
            ({"baseline": "9of9"}, "'9of9' is not a preset"),
            ({"baseline": "10of10", "start": "2026-11-18T14:00:00"}, "start"),
        ):
            refused = api.post("/v1/quotes", json={"reduction_kw": 1.0, **bad})
            assert refused.status_code == 422, refused.text
            assert named in str(refused.json()["detail"]), refused.text
        again = api.post("/v1/quotes", json={"reduction_kw": 1.0})
        assert "counted" not in again.json()


def flat_history(database_url: str, kw: float, now: datetime) -> str:
    """Every 15-minute interval of the 46 days to `now` at `kw`, and a site time zone whose
    clock reads about noon now (so the 10of10 adjustment window, 3 h ending 1 h before an
    event starting now, lies in the day, whatever the hour the test runs): its name."""
    offset_h = 12 - now.hour  # Etc/GMT-N is N hours east of UTC
    zone = f"Etc/GMT{-offset_h:+d}" if offset_h else "Etc/GMT+0"
    store = Store(database_url)
    try:
        for back in range(46, -1, -1):
            day = (now - timedelta(days=back)).date()
            begins = epoch_ms(datetime.combine(day, time(0), tzinfo=UTC))
            closed = [
                begins + slot * 900_000
                for slot in range(96)
                if begins + (slot + 1) * 900_000 <= epoch_ms(now)
            ]
            rows = [interval_row(900, at, kw) for at in closed]
            with store.session() as s:
                repo.replace_meter_intervals(
                    s, length_s=900, start_ms=begins, end_ms=begins + 86400_000, rows=rows
                )
                s.commit()
    finally:
        store.close()
    return zone


@pytest.mark.parametrize("opt_in_baseline", [None, "10of10"])
def test_the_opt_in_opts_out_when_the_counted_firm_kw_falls_short(tmp_path, opt_in_baseline):
    """Baseline days at 0.5 kW, today too: 10of10 gives 0.5 kW (factor 1). The site draws
    far more now, so whatever it sheds, the utility would count 0.5 kW less its level less the
    shed: below the 25% of its baseline an OpenADR SIMPLE level 2 asks. Without the setting
    the same event is opted in on the site's own firm kW."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    zone = flat_history(database_url, 0.5, datetime.now(UTC))
    options = {
        "site_timezone": zone,
        "opt_in_baseline": opt_in_baseline,
        "vtn_allow_unsigned": True,
        "ven_name": "flexgate-test",
    }
    with Vtn() as vtn, running_site(tmp_path, database_url, vtn_url=vtn.url, **options) as site:
        site.wait(lambda: site.api.get("/health").json()["ven"] == "registered", what="the VEN")
        ask = {"baseline": "10of10"}  # the level a quote counts from: the site's, once read
        site.wait(
            lambda: site.api.post("/v1/quotes", json=ask).json()["counted"]["level"]["kw"] > 1.0,
            what="a reading of the site",
        )
        start = datetime.now(UTC) + timedelta(seconds=5)
        event_id = vtn.add_event("simple", "level", 2.0, start, 60)
        site.wait(lambda: event_id in vtn.answers, what="the VTN hearing the answer")
        stored = site.api.get(f"/v1/events/oadr-{event_id}").json()
        if opt_in_baseline is None:
            assert (vtn.answers[event_id], stored["opt"], stored["counted"]) == (
                "optIn",
                "in",
                None,
            )
            return
        assert vtn.answers[event_id] == "optOut"
        assert stored["status"] == "opted_out"
        counted = stored["counted"]
        assert (counted["rule"], counted["reason"], counted["baseline_kw"]) == ("10of10", None, 0.5)
        assert counted["asked_kw"] == pytest.approx(stored["reduction_kw"], abs=1e-3)
        firm_kw = counted["counted_kw"]["firm_kw"]
        assert firm_kw < counted["asked_kw"]
        assert stored["reason"] == counted["short"]
        assert stored["reason"].startswith(f"under 10of10 the utility would count {firm_kw:.1f} kW")
        assert "baseline 0.5 kW" in stored["reason"]
        assert all(w == 700.0 for ws in site.limits().values() for w in ws)


def test_a_manual_event_is_counted_kept_and_recounted_when_the_mix_changes(tmp_path):
    """Baseline days at 0.5 kW, today too: 10of10 gives 0.5 kW. A manual event asking 1 kW
    of a site drawing far more is counted as 0.5 less (its level less its firm shed): short.
    The operator asked for it, so it is stored and armed all the same, the shortfall its
    reason. Emptying the job mix leaves nothing to shed: the re-check recounts, and the firm
    and achievable kW counted are both the baseline less the level, 0.5 - level."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    zone = flat_history(database_url, 0.5, datetime.now(UTC))
    options = {"site_timezone": zone, "opt_in_baseline": "10of10"}
    with running_site(tmp_path, database_url, **options) as site:
        ask = {"baseline": "10of10"}
        site.wait(
            lambda: site.api.post("/v1/quotes", json=ask).json()["counted"]["level"]["kw"] > 1.0,
            what="a reading of the site",
        )
        start = datetime.now(UTC) + timedelta(seconds=600)
        body = {"reduction_kw": 1.0, "start": start.isoformat(), "duration_s": 60}
        created = site.api.post("/v1/events", json=body, headers=API)
        assert created.status_code == 201, created.text
        event_id = created.json()["id"]
        stored = site.api.get(f"/v1/events/{event_id}").json()
        assert stored["status"] == "pending"
        counted = stored["counted"]
        assert (counted["rule"], counted["baseline_kw"], counted["asked_kw"]) == (
            "10of10",
            0.5,
            1.0,
        )
        assert counted["counted_kw"]["firm_kw"] < 1.0
        assert stored["reason"] == counted["short"]
        assert stored["reason"].startswith("under 10of10 the utility would count")
        emptied = site.api.put("/v1/jobs", json={"jobs": []}, headers=API)
        assert emptied.status_code == 200, emptied.text
        recounted = site.wait(
            lambda: (
                (c := site.api.get(f"/v1/events/{event_id}").json()["counted"]) != counted and c
            ),
            what="the recount",
        )
        level_kw = recounted["level"]["kw"]
        assert recounted["counted_kw"]["firm_kw"] == pytest.approx(0.5 - level_kw, abs=2e-3)
        assert recounted["counted_kw"]["achievable_kw"] == pytest.approx(0.5 - level_kw, abs=2e-3)
        again = site.api.get(f"/v1/events/{event_id}").json()
        assert (again["status"], again["reason"]) == ("pending", recounted["short"])


def test_the_re_check_recounts_and_opts_out_an_event_that_now_falls_short(tmp_path):
    """The site's policy opts in to anything (`always`): only the count decides. With the
    site at L kW and F kW firm, the baseline days are written at L + F/2 and the VTN asks F
    (LOAD_DISPATCH delta): counted F/2 + F = 1.5 F, opted in. Emptying the job mix leaves
    nothing to shed: the re-check counts F/2 < F, and the event is opted out with the count
    as its reason."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    zone = flat_history(database_url, 0.5, datetime.now(UTC))
    options = {
        "site_timezone": zone,
        "opt_in_baseline": "10of10",
        "opt_policy": "always",
        "vtn_allow_unsigned": True,
        "ven_name": "flexgate-test",
    }
    with Vtn() as vtn, running_site(tmp_path, database_url, vtn_url=vtn.url, **options) as site:
        site.wait(lambda: site.api.get("/health").json()["ven"] == "registered", what="the VEN")
        ask = {"baseline": "10of10", "window_s": 60}
        site.wait(
            lambda: site.api.post("/v1/quotes", json=ask).json()["counted"]["level"]["kw"] > 1.0,
            what="a reading of the site",
        )
        quote = site.api.post("/v1/quotes", json=ask).json()
        level_kw, firm_kw = quote["counted"]["level"]["kw"], quote["firm_kw"]
        assert firm_kw > 1.0
        flat_history(database_url, level_kw + firm_kw / 2, datetime.now(UTC))
        start = datetime.now(UTC) + timedelta(seconds=600)
        event_id = vtn.add_event("LOAD_DISPATCH", "delta", -firm_kw, start, 60)
        site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
        stored = site.api.get(f"/v1/events/oadr-{event_id}").json()
        assert stored["counted"]["counted_kw"]["firm_kw"] == pytest.approx(1.5 * firm_kw, rel=0.05)
        emptied = site.api.put("/v1/jobs", json={"jobs": []}, headers=API)
        assert emptied.status_code == 200, emptied.text
        gone = site.wait(
            lambda: (
                (e := site.api.get(f"/v1/events/oadr-{event_id}").json())["status"] == "opted_out"
                and e
            ),
            what="the opt-out",
        )
        counted = gone["counted"]
        assert counted["counted_kw"]["firm_kw"] == pytest.approx(0.5 * firm_kw, rel=0.1)
        assert gone["reason"] == f"the site changed: {counted['short']}"
        assert gone["opt"] == "out"  # told to the VTN as a cancellation on the site is


def test_a_window_across_midnight_is_counted_day_by_day(database_url):
    """test_settlement_midnight's Friday night, seen at 22:30 on the site's clock (the
    adjustment window, 19:00-22:00, has happened): 110 kW on the Friday's four intervals,
    68.2 kW on the Saturday's, a mean of 89.1 kW. A site at 90 kW shedding 35 kW is counted
    89.1 - 55 = 34.1 kW."""
    settings = settings_for(
        database_url, site_timezone="Europe/Berlin", settlement_holidays=NIGHT_HOLIDAY.isoformat()
    )
    store = Store(database_url)
    try:
        write_history(store)
        clock = SteppedClock(NIGHT - timedelta(minutes=30))
        counted = Counted(settings, store, clock, power=None)  # type: ignore[arg-type]
        level = {"kw": 90.0, "source": "meter", "estimated": False}
        doc = asyncio.run(
            counted.doc("10of10", NIGHT, NIGHT + timedelta(hours=2), dict(SHEDS), level)
        )
    finally:
        store.close()
    assert doc["reason"] is None
    assert [r["baseline_kw"] for r in doc["intervals"]] == pytest.approx([110.0] * 4 + [68.2] * 4)
    assert doc["baseline_kw"] == pytest.approx(89.1)
    assert doc["counted_kw"]["reduction_kw"] == pytest.approx(34.1)
    assert [p["day"] for p in doc["baseline"]["parts"]] == ["2026-11-20", "2026-11-21"]


def test_while_caps_hold_the_site_an_event_is_counted_from_its_uncapped_level(tmp_path):
    """The meter reads the site held down by an event; a second event counted then is counted
    from the level the site would draw uncapped (the model's, as GET /v1/site says), marked."""
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    zone = flat_history(database_url, 0.5, datetime.now(UTC))
    options = {"site_timezone": zone, "opt_in_baseline": "10of10"}
    with running_site(tmp_path, database_url, **options) as site:
        now = datetime.now(UTC)
        body = {"reduction_kw": 1.0, "start": now.isoformat(), "duration_s": 120}
        assert site.api.post("/v1/events", json=body, headers=API).status_code == 201
        site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="caps")
        later = {**body, "start": (now + timedelta(seconds=600)).isoformat(), "duration_s": 60}
        created = site.api.post("/v1/events", json=later, headers=API)
        assert created.status_code == 201, created.text
        level = created.json()["counted"]["level"]
        assert level["source"] == "model (caps hold the site below its level now)"
        assert level["estimated"] is True
        uncapped_kw = site.api.get("/v1/site").json()["baseline_facility_kw"]
        assert level["kw"] == pytest.approx(uncapped_kw, abs=1e-3)
