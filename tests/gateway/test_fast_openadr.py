"""An OpenADR event with zero notice as a fast trigger (issue 39, item 2(c); docs/fast.md,
"OpenADR events with zero notice"): which events match an armed depth (`zeronotice.match`,
on events read by both VENs' own readers), then end to end: openleadr's real VTN (2.0b) and
the project's 3.1 mock VTN (checking the VEN's messages against the specification's schema;
the Alliance's reference VTN: tests/interop/test_reference_vtn31.py) send events to a gateway
whose agents check signed triggers.
A matching event becomes a fast event naming it and every node at its armed caps; anything
else goes the ordinary way."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from flexgate.lab.mockvtn31 import LAB_CLIENT_ID
from flexgate.serve import free_port
from gateway.openadr.oadr31 import Event
from gateway.openadr.signals import SiteLoad, read_event
from gateway.openadr.signals31 import read_event31
from gateway.openadr.webhook31 import CALLBACK_PATH
from gateway.openadr.zeronotice import match
from tests.gateway import oadr31_examples as ug
from tests.gateway.test_fast import armed_caps, fast_site
from tests.gateway.test_ven import Vtn
from tests.gateway.test_ven31 import SECRET as VTN31_SECRET
from tests.gateway.test_ven31 import mock_vtn

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
SITE = SiteLoad(baseline_facility_kw=100.0, max_capacity_kw=120.0)
DEPTHS = (10.0, 20.0, 30.0, 40.0)
SITE_KW = 100.0  #: the depths' basis in the pure tests


def event20(signal_name, signal_type, value, start, seconds=60, **signal):
    """A 2.0b event as openleadr parses it."""
    return {
        "event_descriptor": {"event_id": "ev-1", "modification_number": 0, "event_status": "far"},
        "active_period": {"dtstart": start, "duration": timedelta(seconds=seconds)},
        "event_signals": [
            {
                "signal_name": signal_name,
                "signal_type": signal_type,
                "intervals": [{"signal_payload": value, "duration": timedelta(seconds=seconds)}],
                **signal,
            }
        ],
    }


def event31(payload, values, start="0001-01-01", duration="PT1M", units=None, intervals=1):
    body = copy.deepcopy(ug.SIMPLE_EVENT)
    body["intervalPeriod"] = {"start": start, "duration": duration}
    body["intervals"] = [
        {"id": i, "payloads": [{"type": payload, "values": values}]} for i in range(intervals)
    ]
    body.pop("payloadDescriptors", None)
    if units:
        body["payloadDescriptors"] = [{"payloadType": payload, "units": units}]
    return read_event31(Event.model_validate(ug.as_read(body)), SITE, NOW)


def found(external, received=NOW, tolerance_pct=1.0):
    out = match(external, received, DEPTHS, SITE_KW, max_notice_s=2.0, tolerance_pct=tolerance_pct)
    return None if out is None else (out.depth_pct, out.duration_s)


@pytest.mark.parametrize(
    ("external", "expected"),
    [
        # 2.0b: SIMPLE level 1 (10 %), a LOAD_DISPATCH delta in kW, a percent offset
        (event20("SIMPLE", "level", 1, NOW), (10.0, 60.0)),
        (event20("LOAD_DISPATCH", "delta", -30.4, NOW - timedelta(seconds=5)), (30.0, 55.0)),
        (event20("LOAD_CONTROL", "x-loadControlPercentOffset", -20, NOW), (20.0, 60.0)),
        # a start 1.5 s ahead is within FLEXGATE_FAST_OPENADR_MAX_NOTICE_S (2 s)
        (event20("SIMPLE", "level", 3, NOW + timedelta(seconds=1.5)), (40.0, 61.5)),
        # SIMPLE level 2 is 25 %: no armed depth within 1 point
        (event20("SIMPLE", "level", 2, NOW), None),
        # notice: the ordinary way
        (event20("SIMPLE", "level", 1, NOW + timedelta(seconds=10)), None),
        # a level to hold (setpoint) is not a step
        (event20("LOAD_DISPATCH", "setpoint", 80.0, NOW), None),
        # longer than a fast trigger's lease (an hour)
        (event20("SIMPLE", "level", 1, NOW, seconds=7200), None),
        # 3.1: SIMPLE, CONTROL_SETPOINT in PERCENT and in KW, starting "now" (0001-01-01)
        (event31("SIMPLE", [3]), (40.0, 60.0)),
        (event31("CONTROL_SETPOINT", [-0.2], units="PERCENT"), (20.0, 60.0)),
        (event31("CONTROL_SETPOINT", [-9.5], units="KW"), (10.0, 60.0)),
        (event31("IMPORT_CAPACITY_LIMIT", [70.0], units="KW"), None),
        (event31("SIMPLE", [1], start=(NOW + timedelta(minutes=5)).isoformat()), None),
        # two intervals of different targets: a schedule, not one step
        (event31("SIMPLE", [1, 3]), None),
    ],
)
def test_which_events_match_an_armed_depth(external, expected):
    if isinstance(external, dict):
        external = read_event(external, SITE)
    assert found(external) == expected


def test_a_test_event_an_opt_out_and_the_tolerance_go_the_ordinary_way():
    delta = read_event(event20("LOAD_DISPATCH", "delta", -21.5, NOW), SITE)
    assert found(delta) is None  # 21.5 % is 1.5 points from 20
    assert found(delta, tolerance_pct=2.0) == (20.0, 60.0)
    test = read_event(event20("SIMPLE", "level", 1, NOW), SITE)
    test.test = True
    assert found(test) is None
    more = read_event(event20("LOAD_DISPATCH", "delta", 10.0, NOW), SITE)
    assert more.opt_out_reason
    assert found(more) is None


def fast_events(site):
    return [e for e in site.api.get("/v1/events").json()["events"] if e["source"] == "fast"]


def site_kw(site) -> float:
    doc = site.api.get("/v1/site").json()
    return doc["baseline_gpu_kw"] * doc["overhead_factor"]


def at_armed(site, depth):
    """Every node at its caps armed at `depth` (the others at their originals)."""
    caps = armed_caps(site, depth)
    return all(
        node.backend.enforced_limit_w(g) == caps[name].get(g, 700.0)
        for name, node in site.nodes.items()
        for g in range(node.backend.count())
    )


def test_a_zero_notice_openleadr_event_fires_the_armed_plan_and_one_with_notice_does_not(
    tmp_path,
):
    with Vtn() as vtn:
        extra = {"vtn_url": vtn.url, "vtn_allow_unsigned": True, "ven_name": "flexgate-test"}
        with fast_site(tmp_path, **extra) as site:
            site.wait(
                lambda: site.api.get("/health").json()["ven"] == "registered",
                what="the VEN's registration",
            )
            kw = round(0.2 * site_kw(site), 3)  # 20 % of the site, in kW
            started = datetime.now(UTC) - timedelta(seconds=1)
            event_id = vtn.add_event("LOAD_DISPATCH", "delta", -kw, started, 20)
            [fast] = site.wait(lambda: fast_events(site), what="the fast event")
            assert fast["external_id"] == event_id
            assert f"OpenADR event {event_id} with zero notice" in fast["reason"]
            assert fast["intervals"][0]["depth_pct"] == 20.0
            site.wait(lambda: at_armed(site, 20.0), what="every node at its armed caps")
            site.wait(lambda: vtn.answers.get(event_id) == "optIn", what="the VTN hearing optIn")
            assert site.api.get(f"/v1/events/oadr-{event_id}").status_code == 404  # no plan
            # With notice, the ordinary way: stored, planned later; no fast event.
            later = vtn.add_event(
                "LOAD_DISPATCH", "delta", -kw, datetime.now(UTC) + timedelta(seconds=120), 20
            )
            stored = site.wait(
                lambda: (
                    (r := site.api.get(f"/v1/events/oadr-{later}")).status_code == 200 and r.json()
                ),
                what="the event with notice stored",
            )
            assert stored["status"] == "pending"
            assert len(fast_events(site)) == 1


def test_a_zero_notice_31_event_fires_the_armed_plan_and_an_unarmed_depth_does_not(tmp_path):
    with mock_vtn() as vtn:
        port = free_port()
        extra = {
            "openadr": "3.1",
            "vtn_url": vtn.url,
            "vtn_client_id": LAB_CLIENT_ID,
            "vtn_client_secret": VTN31_SECRET,
            "vtn_allow_http": True,
            "vtn_poll_s": 30.0,
            "ven_callback_url": f"http://127.0.0.1:{port}{CALLBACK_PATH}",
            "ven_name": "flexgate-test",
            "ven_resources": "site-a",
        }
        with fast_site(tmp_path, gateway_port=port, **extra) as site:
            site.wait(
                lambda: site.api.get("/health").json()["ven"] == "registered",
                what="the VEN's registration",
            )
            site.wait(lambda: vtn.subscriptions, what="the subscription")
            body = {
                "programID": vtn.program["id"],
                "eventName": "fast",
                "intervalPeriod": {"start": "0001-01-01T00:00:00Z", "duration": "PT20S"},
                "payloadDescriptors": [{"payloadType": "CONTROL_SETPOINT", "units": "PERCENT"}],
                "intervals": [
                    {"id": 0, "payloads": [{"type": "CONTROL_SETPOINT", "values": [-0.3]}]}
                ],
            }
            event = vtn.add_event(body)
            [fast] = site.wait(lambda: fast_events(site), seconds=10, what="the fast event")
            assert fast["external_id"] == event["id"]
            assert fast["intervals"][0]["depth_pct"] == 30.0
            site.wait(lambda: at_armed(site, 30.0), what="every node at its armed caps")
            assert site.api.get(f"/v1/events/oadr3-{event['id']}").status_code == 404
            # 25 % is no armed depth: the ordinary way.
            body["intervals"][0]["payloads"][0]["values"] = [-0.25]
            other = vtn.add_event(body)
            stored = site.wait(
                lambda: (
                    (r := site.api.get(f"/v1/events/oadr3-{other['id']}")).status_code == 200
                    and r.json()
                ),
                seconds=10,
                what="the unmatched event stored",
            )
            assert stored["source"] == "openadr"
            assert len(fast_events(site)) == 1
        by_schema = [why for why in vtn.refused if "(the specification)" in why]
        assert by_schema == []
