"""The 3.1 VEN of a real gateway against the OpenADR Alliance's 3.1.0 reference VTN, run
unchanged as a process of its own (`refvtn`): token, registration of the VEN and its
resource, SIMPLE and IMPORT_CAPACITY_LIMIT events, a modification, a deletion, reports stored
on the VTN, its malformed webhook notifications refused (each then read by a poll), and a
gateway restart. The utility's side is the VTN's own business-logic client.

The VTN listens on a free loopback port and uses only the WEBHOOK binding (no shared MQTT
broker), so these tests do not collide with others on ports. They skip, saying why, only where
../shared is absent; its venv is built from PyPI on the first run (see `refvtn`)."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta

import pytest

from flexgate.serve import free_port
from gateway.openadr.webhook31 import CALLBACK_PATH
from tests.gateway.conftest import running_site
from tests.interop import refvtn

# The first run builds the VTN's venv from PyPI inside the first test's setup.
pytestmark = pytest.mark.timeout(refvtn.BUILD_S + 120)

#: The reference VTN holds one ven object per client: every gateway here is this VEN.
VEN_NAME = "flexgate-interop"
#: Polls this far apart: a refused notification, not the timer, makes the VEN read the change.
POLL_S = 30.0


@pytest.fixture(scope="module")
def program(vtn):
    return vtn.post("/programs", {"programName": "flexgate-interop"})


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="flexgate.ven31")
    return caplog


@contextlib.contextmanager
def gateway(tmp_path, vtn, ven_name, port=None):
    port = port or free_port()
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    settings = {
        **ven_settings(vtn, port, ven_name),
        "recovery_ramp_s": 0.2,
        "recovery_steps": 1,
        # SIMPLE level 3 (40%) is more than the example site can promise with the declared
        # jobs' common-mode power error: these tests read the VEN, so the promise is the model's.
        "declared_power_uncertainty": 0.0,
    }
    with running_site(tmp_path, database_url, gateway_port=port, **settings) as site:
        wait_registered(site)
        yield site


def ven_settings(vtn, port, ven_name):
    """The gateway's 3.1 VEN on the reference VTN, its callbacks on `port`."""
    return {
        "openadr": "3.1",
        "vtn_url": vtn.url,
        "vtn_client_id": refvtn.VEN_CLIENT,
        "vtn_client_secret": refvtn.VEN_SECRET,
        "vtn_allow_http": True,
        "vtn_poll_s": POLL_S,
        "ven_callback_url": f"http://127.0.0.1:{port}{CALLBACK_PATH}",
        "ven_name": ven_name,
        "ven_resources": "site-a",
    }


def wait_registered(site):
    site.wait(
        lambda: site.api.get("/health").json()["ven"] == "registered",
        seconds=20,
        what="the VEN's registration with the reference VTN",
    )


def event_body(program, payload, values, start_s=1.0, interval_s=60.0, **extra):
    start = datetime.now(UTC) + timedelta(seconds=start_s)
    return {
        "programID": program["id"],
        "eventName": f"interop {payload}",
        "intervalPeriod": {"start": start.isoformat(), "duration": f"PT{interval_s:g}S"},
        "intervals": [{"id": 0, "payloads": [{"type": payload, "values": values}]}],
        **extra,
    }


def stored(site, event_id):
    answer = site.api.get(f"/v1/events/oadr3-{event_id}")
    return answer.json() if answer.status_code == 200 else None


def status(site, event_id):
    return (stored(site, event_id) or {}).get("status")


def capped(site):
    return any(w < 700 for ws in site.limits().values() for w in ws)


def uncapped(site):
    return all(w == 700.0 for ws in site.limits().values() for w in ws)


def test_registration_subscription_and_a_simple_event_modified_then_deleted(
    tmp_path, vtn, program, logs
):
    with gateway(tmp_path, vtn, VEN_NAME) as site:
        [ven] = [v for v in vtn.get("/vens") if v["venName"] == VEN_NAME]
        resources = vtn.get(f"/resources?venID={ven['id']}")
        assert [r["resourceName"] for r in resources] == ["site-a"]
        # The echo challenge (at callbackUrl/echo) answered: the subscription is stored once.
        site.wait(lambda: "subscribed to event notifications" in logs.text, what="subscription")
        mine = [s for s in vtn.get("/subscriptions") if s["clientName"] == VEN_NAME]
        assert len(mine) == 1

        event = vtn.post("/events", event_body(program, "SIMPLE", [1], start_s=0.5))
        # Its notification is refused (a JSON string of snake_case JSON); a poll reads it.
        site.wait(lambda: status(site, event["id"]) == "active", what="the event active")
        site.wait(lambda: capped(site), what="caps")
        assert "JSON encoded twice" in logs.text
        baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
        assert stored(site, event["id"])["reduction_kw"] == pytest.approx(0.10 * baseline, 1e-3)

        # Its stamps have whole seconds: a change in the same second would look unchanged.
        site.wait(lambda: _a_second_later(event), what="a new second")
        changed = {k: v for k, v in event.items() if k not in _STAMPS}
        changed["intervals"] = [{"id": 0, "payloads": [{"type": "SIMPLE", "values": [3]}]}]
        vtn.put(f"/events/{event['id']}", changed)
        site.wait(
            lambda: (
                stored(site, event["id"])["reduction_kw"] == pytest.approx(0.40 * baseline, 1e-3)
            ),
            what="the modification read",
        )

        vtn.delete(f"/events/{event['id']}")
        site.wait(lambda: status(site, event["id"]) == "cancelled", what="the deletion read")
        site.wait(lambda: uncapped(site), what="the restore")
    assert "Traceback" not in logs.text


def test_an_import_capacity_limit_in_kw_and_its_reports_stored_on_the_vtn(
    tmp_path, vtn, program, logs
):
    with gateway(tmp_path, vtn, VEN_NAME) as site:
        baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
        limit_kw = round(0.8 * baseline, 1)
        body = event_body(
            program,
            "IMPORT_CAPACITY_LIMIT",
            [limit_kw],
            start_s=0.5,
            interval_s=4.0,
            payloadDescriptors=[
                {
                    "objectType": "EVENT_PAYLOAD_DESCRIPTOR",
                    "payloadType": "IMPORT_CAPACITY_LIMIT",
                    "units": "KW",
                }
            ],
            reportDescriptors=[{"payloadType": "DEMAND"}, {"payloadType": "USAGE"}],
        )
        event = vtn.post("/events", body)
        site.wait(lambda: status(site, event["id"]) == "active", what="the limit active")
        site.wait(lambda: capped(site), what="caps")
        reports = site.wait(
            lambda: [r for r in vtn.get("/reports") if r["eventID"] == event["id"]],
            seconds=20,
            what="the interval report stored on the VTN",
        )
        [report] = reports
        assert report["clientName"] == VEN_NAME
        assert {d["payloadType"] for d in report["payloadDescriptors"]} == {"DEMAND", "USAGE"}
        site.wait(lambda: status(site, event["id"]) == "completed", what="the end")


def test_a_price_event_is_opted_out_and_the_vtn_takes_the_reason(tmp_path, vtn, program):
    with gateway(tmp_path, vtn, VEN_NAME) as site:
        event = vtn.post("/events", event_body(program, "PRICE", [0.3], start_s=30))
        site.wait(lambda: status(site, event["id"]) == "opted_out", what="the opt-out")
        told = site.wait(
            lambda: [r for r in vtn.get("/reports") if r["eventID"] == event["id"]],
            what="the reason stored on the VTN",
        )
        assert "PRICE" in told[0]["reportName"]
        assert uncapped(site)


def test_a_restarted_gateway_finds_its_ven_and_resumes_the_event(tmp_path, vtn, program, logs):
    port = free_port()
    with gateway(tmp_path, vtn, VEN_NAME, port=port) as site:
        event = vtn.post("/events", event_body(program, "SIMPLE", [2], start_s=0.5))
        site.wait(lambda: capped(site), what="caps before the restart")
    with gateway(tmp_path, vtn, VEN_NAME, port=port) as site:
        site.wait(lambda: status(site, event["id"]) == "active", what="the event resumed")
        site.wait(lambda: capped(site), what="caps after the restart")
        vens = [v for v in vtn.get("/vens") if v["venName"] == VEN_NAME]
        assert len(vens) == 1  # found by name, not created again
        site.wait(
            lambda: logs.text.count("subscribed to event notifications") == 2,
            what="subscribed again",
        )
        mine = [s for s in vtn.get("/subscriptions") if s["clientName"] == VEN_NAME]
        assert len(mine) == 1  # the first run's deleted (its token is gone with it)
        vtn.delete(f"/events/{event['id']}")
        site.wait(lambda: uncapped(site), what="the restore")


_STAMPS = ("id", "objectType", "createdDateTime", "modificationDateTime")


def _a_second_later(event) -> bool:
    stamp = datetime.fromisoformat(event["modificationDateTime"]).replace(tzinfo=UTC)
    return datetime.now(UTC) - stamp > timedelta(seconds=1.1)


def test_a_zero_notice_event_fires_the_armed_plans_through_the_fast_path(
    tmp_path, vtn, program, logs
):
    """A CONTROL_SETPOINT of -30 % starting now, issued by the utility's business logic: the
    VEN fires the site's armed 30 % caps through one signed trigger (docs/fast.md, "OpenADR
    events with zero notice") and stores no ordinary event; with notice, the ordinary way."""
    from tests.gateway.test_fast import fast_site
    from tests.gateway.test_fast_openadr import at_armed, fast_events

    port = free_port()
    settings = ven_settings(vtn, port, VEN_NAME)
    setpoint = [
        {
            "objectType": "EVENT_PAYLOAD_DESCRIPTOR",
            "payloadType": "CONTROL_SETPOINT",
            "units": "PERCENT",
        }
    ]
    with fast_site(tmp_path, gateway_port=port, **settings) as site:
        wait_registered(site)
        body = event_body(program, "CONTROL_SETPOINT", [-0.3], payloadDescriptors=setpoint)
        body["intervalPeriod"] = {"start": "0001-01-01T00:00:00Z", "duration": "PT30S"}
        event = vtn.post("/events", body)
        [fast] = site.wait(lambda: fast_events(site), seconds=POLL_S + 10, what="the fast event")
        assert fast["external_id"] == event["id"]
        assert fast["intervals"][0]["depth_pct"] == 30.0
        site.wait(lambda: at_armed(site, 30.0), what="every node at its armed caps")
        assert stored(site, event["id"]) is None
        later = vtn.post(
            "/events",
            event_body(
                program, "CONTROL_SETPOINT", [-0.3], start_s=300.0, payloadDescriptors=setpoint
            ),
        )
        site.wait(
            lambda: status(site, later["id"]) == "pending",
            seconds=POLL_S + 10,
            what="the event with notice stored",
        )
        assert len(fast_events(site)) == 1
