"""OpenADR 3.1 events -> facility kW (`signals31`), on the User Guide's own examples
(tests/gateway/oadr31_examples.py) and on every kind of bad event, refused with the reason."""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gateway.openadr.oadr31 import Event, Program, Report
from gateway.openadr.signals import SiteLoad
from gateway.openadr.signals31 import Party31, RefusedEventError, read_event31
from tests.gateway import oadr31_examples as ug

SITE = SiteLoad(baseline_facility_kw=100.0, max_capacity_kw=120.0)
BEFORE_2023 = datetime(2023, 2, 9, 12, tzinfo=UTC)  # before the examples' 2023-02-10 start
BEFORE_2025 = datetime(2025, 3, 13, 12, tzinfo=UTC)


def read(body, now=BEFORE_2023, party=None, rng=None):
    return read_event31(Event.model_validate(ug.as_read(body)), SITE, now, rng=rng, party=party)


def test_the_simple_example_sheds_a_level_share_of_the_baseline():
    out = read(ug.SIMPLE_EVENT, now=BEFORE_2025)
    assert out.opt_out_reason is None
    [interval] = out.intervals
    assert interval.baseline_share == pytest.approx(0.10)  # level 1
    assert interval.reduction_kw == pytest.approx(10.0)
    assert interval.start == datetime(2025, 3, 14, tzinfo=UTC)
    assert interval.end - interval.start == timedelta(hours=4)


def test_the_capacity_limit_example_holds_each_import_limit_and_notes_the_export_ones():
    out = read(ug.CAPACITY_LIMIT_EVENT)
    assert out.opt_out_reason is None
    assert [i.level_kw for i in out.intervals] == [10.0, 8.0]
    assert [i.reduction_kw for i in out.intervals] == [90.0, 92.0]
    assert out.intervals[1].start - out.intervals[0].start == timedelta(minutes=30)
    assert any("EXPORT_CAPACITY_LIMIT: not a payload flexgate acts on" in r for r in out.ignored)


def test_the_load_control_example_is_a_dispatch_setpoint_level():
    [interval] = read(ug.LOAD_CONTROL_EVENT, now=BEFORE_2025).intervals
    assert interval.level_kw == 0.0
    assert interval.reduction_now_kw(80.0, 100.0) == 80.0  # a level follows the load


def test_the_setpoint_example_is_a_change_of_015_kw_held_open_ended():
    now = datetime(2026, 6, 1, tzinfo=UTC)  # long after its start: P9999Y is still on
    [interval] = read(ug.SETPOINT_EVENT, now=now).intervals
    assert interval.reduction_kw == pytest.approx(0.15)
    assert interval.end == now + timedelta(hours=24)  # open-ended, as 2.0b's duration 0


@pytest.mark.parametrize("example", [ug.MINIMAL_PRICE_EVENT, ug.VARIABLE_INTERVALS_EVENT])
def test_price_examples_are_not_acted_on_with_the_reason(example):
    out = read(example)
    assert out.intervals == []
    assert "no payload flexgate can act on" in out.opt_out_reason
    assert "PRICE: not a payload flexgate acts on" in out.opt_out_reason


def test_the_variable_intervals_example_times_the_second_interval_by_its_own_duration():
    body = copy.deepcopy(ug.VARIABLE_INTERVALS_EVENT)
    for interval in body["intervals"]:
        interval["payloads"] = [{"type": "SIMPLE", "values": [interval["id"] + 1]}]
    out = read(body)
    assert [(i.end - i.start) for i in out.intervals] == [timedelta(hours=1), timedelta(hours=2)]
    assert out.intervals[1].start == out.intervals[0].end


def test_an_event_for_another_ven_is_not_acted_on():
    out = read(ug.CAPACITY_RESERVATION_EVENT, party=Party31("flexgate", frozenset({"site-a"})))
    assert out.intervals == []
    assert "VEN-99" in out.opt_out_reason


def test_a_target_this_ven_was_granted_reaches_it():
    body = {**ug.SIMPLE_EVENT, "targets": ["site-a"]}
    out = read(body, now=BEFORE_2025, party=Party31("flexgate", frozenset({"site-a"})))
    assert out.opt_out_reason is None
    assert out.intervals


def test_several_values_split_the_interval_and_the_strictest_holds_per_slice():
    body = copy.deepcopy(ug.CAPACITY_LIMIT_EVENT)
    body["intervals"] = [
        {"id": 0, "payloads": [{"type": "IMPORT_CAPACITY_LIMIT", "values": [60.0, 30.0]}]}
    ]
    out = read(body)
    assert [i.level_kw for i in out.intervals] == [60.0, 30.0]
    assert out.intervals[0].end - out.intervals[0].start == timedelta(minutes=15)


def test_randomize_start_shifts_every_interval_by_one_offset_within_its_bounds():
    body = copy.deepcopy(ug.CAPACITY_LIMIT_EVENT)
    body["intervalPeriod"]["randomizeStart"] = "PT10M"
    out = read(body, rng=random.Random(7))
    offset = out.intervals[0].start - datetime(2023, 2, 10, tzinfo=UTC)
    assert timedelta(minutes=-10) <= offset <= timedelta(minutes=10)
    assert offset
    assert out.intervals[1].start - out.intervals[0].start == timedelta(minutes=30)
    assert out.start_offset_s == pytest.approx(offset.total_seconds())


def test_do_it_now_starts_at_receipt():
    body = copy.deepcopy(ug.SIMPLE_EVENT)
    body["intervalPeriod"] = {"start": "0001-01-01", "duration": "PT1H"}
    now = datetime(2026, 6, 1, 12, tzinfo=UTC)
    [interval] = read(body, now=now).intervals
    assert interval.start == now
    assert interval.end == now + timedelta(hours=1)


def test_a_positive_control_setpoint_asks_for_more_load_and_is_an_opt_out():
    body = copy.deepcopy(ug.SETPOINT_EVENT)
    body["intervals"][0]["payloads"][0]["values"] = [5.0]
    out = read(body)
    assert out.intervals == []
    assert "more load" in out.opt_out_reason


def test_control_setpoint_in_percent_is_a_share_of_the_baseline():
    body = copy.deepcopy(ug.SETPOINT_EVENT)
    body["payloadDescriptors"] = [{"payloadType": "CONTROL_SETPOINT", "units": "PERCENT"}]
    body["intervals"][0]["payloads"][0]["values"] = [-0.2]
    [interval] = read(body).intervals
    assert interval.baseline_share == pytest.approx(0.2)


def _with(path, value, base=ug.CAPACITY_LIMIT_EVENT):
    body = copy.deepcopy(base)
    where = body
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_with(["intervals", 0, "payloads", 0, "values"], ["ten"]), "'ten' is not a number"),
        (_with(["intervals", 0, "payloads", 0, "values"], [True]), "True is not a number"),
        (_with(["intervals", 0, "payloads", 0, "values"], [-5.0]), "negative"),
        (_with(["intervals"], []), "no intervals"),
        (_with(["intervalPeriod", "duration"], "-PT30M"), "is negative"),
        (_with(["intervalPeriod", "randomizeStart"], "-PT1M"), "randomizeStart"),
        (_with(["intervalPeriod"], None), "no start"),
        (_with(["payloadDescriptors", 0, "units"], "KWH"), "a level is power"),
        (_with(["intervals", 0, "payloads", 0, "values"], []), "no values"),
        (
            _with(["intervals", 0, "payloads"], [{"type": "SIMPLE", "values": [7]}]),
            "SIMPLE is a level 0 to 3",
        ),
    ],
)
def test_a_bad_event_is_refused_with_the_reason(body, reason):
    with pytest.raises(RefusedEventError, match=reason):
        read(body)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({k: v for k, v in ug.SIMPLE_EVENT.items() if k != "programID"}, "programID"),
        (_with(["intervals"], "none"), "intervals"),
        (_with(["intervals", 0, "id"], "first"), "intervals.0.id"),
        (_with(["intervals", 0, "payloads", 0], {"values": [1]}), "type"),
        (_with(["intervalPeriod", "duration"], "an hour"), "duration"),
        (_with(["priority"], -1), "priority"),
    ],
)
def test_what_the_31_schema_forbids_is_refused_by_the_models(body, where):
    with pytest.raises(ValidationError, match=where):
        Event.model_validate(ug.as_read(body))


def test_the_user_guides_report_is_a_valid_31_report():
    assert Report.model_validate(ug.AGGREGATED_REPORT).resources[0].intervals[0].id == 0


def test_units_come_from_the_program_when_the_event_has_none():
    body = {k: v for k, v in ug.LOAD_CONTROL_EVENT.items() if k != "payloadDescriptors"}
    event = Event.model_validate(ug.as_read(body))
    in_kwh = Program.model_validate(
        {
            "id": "44",
            "programName": "energy",
            "payloadDescriptors": [{"payloadType": "DISPATCH_SETPOINT", "units": "KWH"}],
        }
    )
    with pytest.raises(RefusedEventError, match="units KWH"):
        read_event31(event, SITE, BEFORE_2025, program=in_kwh)
    own = Event.model_validate(ug.as_read(ug.LOAD_CONTROL_EVENT))  # its own KW wins
    assert read_event31(own, SITE, BEFORE_2025, program=in_kwh).intervals[0].level_kw == 0.0
