"""OpenADR signals -> facility targets, on the independent EPRI payloads and on built events."""

import random
from datetime import UTC, datetime, timedelta

import pytest
from openleadr.messaging import parse_message

from gateway.openadr.signals import Party, SiteLoad, read_event

SITE = SiteLoad(baseline_facility_kw=1000.0, max_capacity_kw=1200.0)
T0 = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)


def vector(shared, name):
    kind, message = parse_message((shared / "vectors" / "openadr2b" / name).read_bytes())
    assert kind == "oadrDistributeEvent"
    return message["events"]


def test_epri_two_signals_act_on_simple_and_say_why_not_on_price(shared):
    (event,) = vector(shared, "distribute_event_1event2signals.xml")
    plan = read_event(event, SITE)
    assert plan.event_id == "71dd232a8dab3b1a7279"
    assert plan.opt_out_reason is None
    assert plan.ignored == ["ENERGY_PRICE/price: not a signal flexgate acts on"]
    start = datetime(2015, 6, 26, 18, 0, tzinfo=UTC)
    # simple/delta levels 0, 1, 2 over 40 minutes each: 0%, 10%, 25% of the baseline.
    assert [(i.start - start, i.end - start, i.reduction_kw) for i in plan.intervals] == [
        (timedelta(0), timedelta(minutes=40), 0.0),
        (timedelta(minutes=40), timedelta(minutes=80), 100.0),
        (timedelta(minutes=80), timedelta(minutes=120), 250.0),
    ]


def test_epri_price_only_event_is_an_opt_out_with_its_reason(shared):
    (event,) = vector(shared, "distribute_event_active.xml")
    plan = read_event(event, SITE)
    assert plan.intervals == []
    assert "ENERGY_PRICE/price: not a signal flexgate acts on" in plan.opt_out_reason


def test_epri_vtn_capture_statuses_and_levels(shared):
    events = vector(shared, "epri_vtn_distribute_event.xml")
    plans = [read_event(e, SITE) for e in events]
    assert [(p.event_id, p.status, p.modification) for p in plans] == [
        ("8645429d9bab36b8be96", "active", 0),
        ("55b2238d1cfcd3269872", "completed", 0),
        ("c7056058b7019a6bd7dd", "completed", 0),
        ("a2c586adc9b698e4e2ef", "completed", 1),
    ]
    assert [p.intervals[0].reduction_kw for p in plans] == [250.0, 400.0, 250.0, 0.0]


def test_kisensum_events_without_payload_are_not_acted_on(shared):
    events = vector(shared, "kisensum_vtn_distribute_event.xml")
    plans = [read_event(e, SITE) for e in events]
    assert all(p.intervals == [] and "no payload" in p.opt_out_reason for p in plans)


def event(*signals, duration=3600, ramp=0, startafter=0, test=False):
    return {
        "event_descriptor": {
            "event_id": "e1",
            "modification_number": 2,
            "event_status": "far",
            "test_event": test,
        },
        "active_period": {
            "dtstart": T0,
            "duration": timedelta(seconds=duration),
            "ramp_up": timedelta(seconds=ramp),
            "tolerance": {"tolerate": {"startafter": timedelta(seconds=startafter)}},
        },
        "event_signals": list(signals),
    }


def signal(name, kind, *values, minutes=30, units=None, scale=None):
    out = {
        "signal_name": name,
        "signal_type": kind,
        "intervals": [
            {"duration": timedelta(minutes=minutes), "signal_payload": v, "uid": i}
            for i, v in enumerate(values)
        ],
    }
    if units:
        out["measurement"] = {"item_name": "powerReal", "item_units": units, "si_scale_code": scale}
    return out


@pytest.mark.parametrize(
    ("sig", "reductions"),
    [
        (signal("LOAD_DISPATCH", "setpoint", 800.0, 700.0), [200.0, 300.0]),
        (signal("LOAD_DISPATCH", "setpoint", 0.9, units="W", scale="M"), [100.0]),
        (signal("LOAD_DISPATCH", "setpoint", 900000.0, units="W"), [100.0]),
        (signal("LOAD_DISPATCH", "delta", -150.0), [150.0]),
        (signal("LOAD_DISPATCH", "delta", -150.0, units="W", scale="k"), [150.0]),
        (signal("LOAD_CONTROL", "x-loadControlCapacity", 0.75), [100.0]),
        (signal("LOAD_CONTROL", "x-loadControlPercentOffset", -20.0), [200.0]),
        (signal("LOAD_CONTROL", "x-loadControlSetpoint", 650.0), [350.0]),
        (signal("simple", "level", 3.0, 7.0, -1.0), [400.0, 400.0, 0.0]),
    ],
)
def test_signal_mapping(sig, reductions):
    plan = read_event(event(sig, duration=len(sig["intervals"]) * 1800), SITE)
    assert plan.opt_out_reason is None
    expected = []
    for r in reductions:  # equal neighbours merge
        if not expected or expected[-1] != r:
            expected.append(r)
    assert [i.reduction_kw for i in plan.intervals] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("sig", "words"),
    [
        (signal("LOAD_DISPATCH", "delta", 50.0), "asks for more load"),
        (signal("LOAD_CONTROL", "x-loadControlPercentOffset", 10.0), "asks for more load"),
        (signal("LOAD_CONTROL", "x-loadControlLevelOffset", -1.0), "not a signal flexgate acts on"),
        (signal("BID_LOAD", "setpoint", 10.0), "not a signal flexgate acts on"),
    ],
)
def test_signals_flexgate_will_not_follow_opt_out_with_the_reason(sig, words):
    plan = read_event(event(sig), SITE)
    assert plan.intervals == []
    assert words in plan.opt_out_reason


def test_overlapping_signals_the_strictest_wins():
    plan = read_event(
        event(
            signal("simple", "level", 1.0, 2.0),  # 100 then 250, 30 min each
            signal("LOAD_DISPATCH", "delta", -180.0, minutes=60),
        ),
        SITE,
    )
    assert [(i.start - T0, i.reduction_kw) for i in plan.intervals] == [
        (timedelta(0), 180.0),
        (timedelta(minutes=30), 250.0),
    ]


def test_startafter_shifts_the_schedule_by_a_random_offset_within_it():
    plan = read_event(
        event(signal("simple", "level", 2.0), startafter=120), SITE, rng=random.Random(3)
    )
    assert 0 < plan.start_offset_s <= 120
    assert plan.start == T0 + timedelta(seconds=plan.start_offset_s)
    again = read_event(
        event(signal("simple", "level", 2.0), startafter=120), SITE, rng=random.Random(3)
    )
    assert again.start_offset_s == plan.start_offset_s


def test_ramp_up_test_events_and_open_ended_intervals():
    plan = read_event(
        event(signal("simple", "level", 2.0, minutes=0), duration=0, ramp=300, test=True), SITE
    )
    assert plan.test is True  # the VEN answers a test event but never acts on it
    assert plan.ramp_up_s == 300
    assert plan.modification == 2
    # open-ended: until cancelled; the ramp-up's steps come before it
    assert plan.end - plan.start == timedelta(hours=24, seconds=300)


def test_ramp_up_steps_caps_down_before_the_first_interval_starts():
    plan = read_event(event(signal("LOAD_DISPATCH", "delta", -90.0, -30.0), ramp=60), SITE)
    assert [(i.start - T0, i.end - T0, i.reduction_kw) for i in plan.intervals] == [
        (timedelta(seconds=-60), timedelta(seconds=-40), pytest.approx(30.0)),
        (timedelta(seconds=-40), timedelta(seconds=-20), pytest.approx(60.0)),
        (timedelta(seconds=-20), timedelta(0), pytest.approx(90.0)),
        (timedelta(0), timedelta(minutes=30), 90.0),  # the target holds from the start
        (timedelta(minutes=30), timedelta(minutes=60), 30.0),
    ]
    assert plan.start == T0 - timedelta(seconds=60)
    assert read_event(event(signal("LOAD_DISPATCH", "delta", -90.0)), SITE).start == T0


def test_targets_decide_whether_the_event_is_for_this_ven(shared):
    (event,) = vector(shared, "distribute_event_1event2signals.xml")  # targets venID deef06...
    me = Party("deef06ba5329fcc0e5fa")
    assert read_event(event, SITE, party=me).opt_out_reason is None
    assert len(read_event(event, SITE, party=me).intervals) == 3
    other = read_event(event, SITE, party=Party("someone-else", frozenset({"g1"})))
    assert other.intervals == []
    assert other.opt_out_reason == "not targeted at this VEN (targets: ven_id=deef06ba5329fcc0e5fa)"
    by_group = {**event, "targets": [{"group_id": "west"}, {"resource_id": "hall-2"}]}
    assert read_event(by_group, SITE, party=Party("x", groups=frozenset({"west"}))).intervals
    assert read_event(by_group, SITE, party=Party("x", resources=frozenset({"hall-2"}))).intervals
    assert not read_event(by_group, SITE, party=Party("x", frozenset({"east"}))).intervals
    # No targets: the event is for every VEN that receives it.
    assert read_event({**event, "targets": []}, SITE, party=Party(None)).intervals
