"""OpenADR reports under the program's baseline rule (issue 38, item 3's reports): the 3.1
interval reports' facility figures are the event's settlement, checked on the hand-worked
site of `test_settlement` (10of10: 110 kW; metered 70, 70, 80, 70 kW, the 14:15 interval
estimated, the 14:30 one faulted), against the specification's schema and the settlement
`GET /v1/events/{id}/settlement` serves (`Settlement.doc`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gateway.clock import SteppedClock
from gateway.openadr.oadr31 import Event, ReportDescriptor
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.openadr.reports31 import interval_report
from gateway.services.meterhistory import MeterHistory
from gateway.services.settlement import Settlement
from gateway.store.db import Store
from tests.gateway.test_settlement import HOLIDAY, START, settings_for, write_site

ASKED = [
    ReportDescriptor.model_validate({"payloadType": t})
    for t in ("DEMAND", "USAGE", "BASELINE", "DELTA_USAGE")
]
#: The site as `GET /v1/site` shows it: what the GPUS resource reports.
SITE = {
    "facility_power_kw": 75.0,
    "baseline_facility_kw": 120.0,
    "gpu_power_kw": 50.0,
    "baseline_gpu_kw": 80.0,
}
QUARTER = timedelta(minutes=15)


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def settled_site(database_url, *, rule="10of10", history_days=20):
    """The hand-worked site's settlement, and the program's rule over it."""
    settings = settings_for(
        database_url, settlement_holidays=HOLIDAY.isoformat(), report_baseline=rule
    )
    store = Store(database_url)
    write_site(store, history_days=history_days)
    clock = SteppedClock(datetime(2026, 12, 1, tzinfo=UTC))
    settlement = Settlement(settings, store, clock)
    return (
        store,
        settlement,
        ProgramBaseline(rule, settlement, MeterHistory(settings, store, clock)),
    )


def event31(minutes: int, intervals: int) -> Event:
    return Event.model_validate(
        {
            "id": "e-1",
            "programID": "p-1",
            "intervalPeriod": {"start": START.isoformat(), "duration": f"PT{minutes}M"},
            "intervals": [
                {"id": i, "payloads": [{"type": "SIMPLE", "values": [1]}]} for i in range(intervals)
            ],
        }
    )


def facility(report):
    """FACILITY's figures: payload type -> (value, its DATA_QUALITY)."""
    [where] = [r for r in report["resources"] if r["resourceName"] == "FACILITY"]
    out = {}
    for interval in where["intervals"]:
        payload, quality = interval["payloads"]
        assert quality["type"] == "DATA_QUALITY"
        out[payload["type"]] = (payload["values"][0], quality["values"][0])
    return out


def reports_over(program, event, spans):
    out = []
    for i, (begin, end) in enumerate(spans):
        settled = asyncio.run(program.over("ev-1", begin, end))
        out.append(interval_report(event, "flexgate", ASKED, i, begin, end, SITE, settled))
    return out


def test_each_31_interval_reports_the_settlement_under_the_programs_rule(database_url, spec):
    store, settlement, program = settled_site(database_url)
    try:
        spans = [(START + QUARTER * i, START + QUARTER * (i + 1)) for i in range(4)]
        reports = reports_over(program, event31(15, 4), spans)
        served = asyncio.run(settlement.doc("ev-1"))  # what GET .../settlement serves
    finally:
        store.close()
    for report in reports:
        assert spec.problems("reportRequest", report) == []
    figures = [facility(r) for r in reports]
    ok, estimated = "OK", "ESTIMATED"
    assert figures == [
        {
            "DEMAND": (70.0, ok),
            "USAGE": (17.5, ok),
            "BASELINE": (110.0, ok),
            "DELTA_USAGE": (-40.0, ok),
        },
        {
            "DEMAND": (70.0, estimated),
            "USAGE": (17.5, estimated),
            "BASELINE": (110.0, ok),
            "DELTA_USAGE": (-40.0, estimated),
        },
        {
            "DEMAND": (80.0, estimated),  # taken while the meter faulted: the estimate
            "USAGE": (20.0, estimated),
            "BASELINE": (110.0, ok),
            "DELTA_USAGE": (-30.0, estimated),
        },
        {
            "DEMAND": (70.0, ok),
            "USAGE": (17.5, ok),
            "BASELINE": (110.0, ok),
            "DELTA_USAGE": (-40.0, ok),
        },
    ]
    [rule] = [r for r in served["rules"] if r["rule"] == "10of10"]
    assert [f["BASELINE"][0] for f in figures] == [r["baseline_kw"] for r in rule["intervals"]]
    assert [f["DEMAND"][0] for f in figures] == [r["metered_kw"] for r in rule["intervals"]]
    assert [-f["DELTA_USAGE"][0] for f in figures] == [r["delivered_kw"] for r in rule["intervals"]]
    assert [f["USAGE"][0] - f["BASELINE"][0] * 0.25 for f in figures] == pytest.approx(
        [-r["delivered_kwh"] for r in rule["intervals"]]
    )
    # Each interval stated by itself: its own period, the resource's.
    [where] = [r for r in reports[1]["resources"] if r["resourceName"] == "FACILITY"]
    assert {i["id"] for i in where["intervals"]} == {1}
    starts = {datetime.fromisoformat(i["intervalPeriod"]["start"]) for i in where["intervals"]}
    assert starts == {spans[1][0]}
    # The GPUS resource is the agents' measurement, as before.
    [gpus] = [r for r in reports[0]["resources"] if r["resourceName"] == "GPUS"]
    assert {p["type"]: p["values"][0] for p in gpus["intervals"][0]["payloads"]} == {
        "DEMAND": 50.0,
        "USAGE": pytest.approx(12.5),
        "BASELINE": 80.0,
        "DELTA_USAGE": -30.0,
    }


def test_an_hour_interval_is_its_four_settlement_intervals_together(database_url, spec):
    """70, 70, 80, 70 kW metered: 72.5 kW, 72.5 kWh, against 110 kW: -37.5 kW, the
    settlement's mean delivered kW; two of the four estimated, so the hour is."""
    store, settlement, program = settled_site(database_url)
    try:
        [report] = reports_over(program, event31(60, 1), [(START, START + 4 * QUARTER)])
        served = asyncio.run(settlement.doc("ev-1"))
    finally:
        store.close()
    assert spec.problems("reportRequest", report) == []
    assert facility(report) == {
        "DEMAND": (72.5, "ESTIMATED"),
        "USAGE": (72.5, "ESTIMATED"),
        "BASELINE": (110.0, "OK"),
        "DELTA_USAGE": (-37.5, "ESTIMATED"),
    }
    [rule] = [r for r in served["rules"] if r["rule"] == "10of10"]
    assert -facility(report)["DELTA_USAGE"][0] == rule["totals"]["mean_delivered_kw"]


def test_a_rule_without_a_baseline_reports_the_metered_load_alone_and_says_why(database_url):
    """Six days of history: 10of10 finds three eligible days of the ten it needs."""
    store, _, program = settled_site(database_url, history_days=6)
    try:
        settled = asyncio.run(program.over("ev-1", START, START + QUARTER))
        [report] = reports_over(program, event31(15, 1), [(START, START + QUARTER)])
    finally:
        store.close()
    assert settled.baseline_kw is None
    assert settled.reason.startswith("3 eligible days, 10 needed")
    assert facility(report) == {"DEMAND": (70.0, "OK"), "USAGE": (17.5, "OK")}


def test_a_span_off_the_minutes_or_outside_the_event_has_no_figures_and_says_why(database_url):
    store, _, program = settled_site(database_url)
    try:
        odd = asyncio.run(program.over("ev-1", START, START + timedelta(seconds=90)))
        after = asyncio.run(program.over("ev-1", START + 4 * QUARTER, START + 5 * QUARTER))
        gone = asyncio.run(program.over("ev-9", START, START + QUARTER))
        [report] = reports_over(program, event31(15, 1), [(START, START + timedelta(seconds=90))])
    finally:
        store.close()
    assert (odd.baseline_kw, odd.metered_kw) == (None, None)
    assert odd.reason.endswith("is not whole minutes")
    assert after.reason.startswith("the settlement does not cover [2026-11-18T15:00:00")
    assert gone.reason == "no settlement of ev-9: no event 'ev-9'"
    assert [r["resourceName"] for r in report["resources"]] == ["GPUS"]  # nothing to settle


def test_an_unknown_rule_is_refused_at_load_naming_it(database_url):
    with pytest.raises(ValidationError, match="FLEXGATE_REPORT_BASELINE: 'tenoften' is not a"):
        settings_for(database_url, report_baseline="tenoften")
