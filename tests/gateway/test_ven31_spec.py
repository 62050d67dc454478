"""The 3.1 VEN held to the specification's own schema and to what the Alliance's reference VTN
did to it (issue 32): the token request's form body, the webhook's echo challenge, notifications
answered before the work they bring, malformed notifications refused with polling taking over,
subscriptions not piling up, report payload descriptors. The mock VTN (a real uvicorn server)
plays each of the reference VTN's habits on demand; every object the VEN sends is checked
against `openadr3.yaml` by it where ../shared is beside the clone."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import ValidationError

from gateway.openadr.oadr31 import Event, ReportDescriptor
from gateway.openadr.reports31 import interval_report, refusal_report
from tests.gateway.test_ven31 import (
    capped,
    mock_vtn,
    simple_event,
    stored,
    ven_site,
)


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.INFO, logger="flexgate.ven31")
    return caplog


def callback(vtn) -> str:
    [subscription] = vtn.subscriptions.values()
    return subscription["objectOperations"][0]["callbackUrl"]


# --- the token ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "setting"), [("body", {}), ("basic", {"vtn_client_auth": "basic"})]
)
def test_the_credentials_go_one_way_only_the_form_body_unless_basic_is_set(
    tmp_path, database_url, how, setting
):
    """The reference VTN answers `400 'client_id' is a required property` to HTTP Basic."""
    with (
        mock_vtn(client_auth=frozenset({how})) as vtn,
        ven_site(tmp_path, database_url, vtn, webhook=False, **setting),
    ):
        assert set(vtn.token_requests) == {how}
        assert vtn.refused == []


# --- the webhook -------------------------------------------------------------------------


def test_the_echo_challenge_is_answered_on_the_callback_and_on_its_echo_path(
    tmp_path, database_url
):
    with mock_vtn() as vtn, ven_site(tmp_path, database_url, vtn):
        url = callback(vtn)  # stored only once the mock's own challenge was answered
        for where in (url, f"{url}/echo"):  # the Definition's; the reference VTN's
            answer = httpx.get(where, params={"echo": "a-7Zq"})
            assert answer.status_code == 200
            assert answer.text == "a-7Zq"
            assert answer.headers["content-type"].startswith("text/plain")
        assert httpx.get(url).status_code == 400


def test_a_notification_is_answered_before_the_work_it_brings(tmp_path, database_url):
    """A VTN serving one request at a time while it posts: the VEN's refusal report must not
    be what the answer waits for (it waited for the VEN's 5 s timeout)."""
    with mock_vtn() as vtn, ven_site(tmp_path, database_url, vtn) as site:
        vtn.one_at_a_time = True
        body = simple_event(vtn, start_s=0.5, interval_s=60, intervals=1)
        body["intervals"][0]["payloads"][0]["values"] = ["two"]  # refused, and reported
        event = vtn.add_raw_event(body)
        assert vtn.delivered[-1][1] == 200
        assert vtn.delivery_s[-1] < 2.0
        site.wait(lambda: stored(site, event["id"]), what="the refusal stored")
        site.wait(
            lambda: [r for r in vtn.reports if r["eventID"] == event["id"]],
            what="the refusal reported",
        )


def test_a_malformed_notification_is_refused_with_the_reason_and_polling_takes_over(
    tmp_path, database_url, logs
):
    """The reference VTN's webhook bodies are a JSON string of snake_case JSON."""
    with mock_vtn() as vtn, ven_site(tmp_path, database_url, vtn, vtn_poll_s=3600.0) as site:
        vtn.double_encoded = True
        first = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        assert vtn.delivered[-1][1] == 400
        # Polls are an hour apart: the refused notification made the VEN poll.
        site.wait(lambda: stored(site, first["id"]), what="the event by the poll it caused")
        site.wait(lambda: capped(site), what="caps")
        second = vtn.add_event(simple_event(vtn, start_s=30, interval_s=60, intervals=1))
        site.wait(lambda: stored(site, second["id"]), what="the second event")
    assert logs.text.count("JSON encoded twice") == 1  # said once, not per notification


# --- subscriptions -----------------------------------------------------------------------


def test_refused_subscriptions_back_off_and_leave_none_behind(tmp_path, database_url, logs):
    """The reference VTN stores a subscription, then answers 500 when its echo test fails."""
    with mock_vtn() as vtn:
        vtn.subscription_failure = 500
        callback_url = "http://127.0.0.1:9/openadr3/notifications"  # never called here
        with ven_site(
            tmp_path,
            database_url,
            vtn,
            webhook=False,
            vtn_poll_s=0.2,
            ven_callback_url=callback_url,
        ) as site:
            most = 0
            began = time.monotonic()
            while time.monotonic() - began < 2.0:  # attempts at 0 s and 1 s; polls every 0.2 s
                most = max(most, len(vtn.subscriptions))
                time.sleep(0.05)
            assert vtn.subscription_posts == 2
            assert most == 1  # each attempt deleted the one the last left
            vtn.subscription_failure = None  # now refused before it is stored (no echo here)
            site.wait(lambda: vtn.subscription_posts == 3, what="the attempt at 3 s")
            assert vtn.subscriptions == {}  # the last leftover deleted before it
    assert logs.text.count("HTTP 500 Echo issue") == 1  # said once, not per attempt


# --- what the VEN sends, against the specification's schema -------------------------------


def test_every_report_the_ven_builds_is_a_report_request_of_the_specification(spec):
    now = datetime.now(UTC)
    event = Event.model_validate(simple_event_body(now))
    asked = [ReportDescriptor.model_validate({"payloadType": t}) for t in ("DEMAND", "USAGE")]
    asked += [
        ReportDescriptor.model_validate({"payloadType": t}) for t in ("BASELINE", "DELTA_USAGE")
    ]
    site = {
        "facility_power_kw": 120.0,
        "baseline_facility_kw": 150.0,
        "gpu_power_kw": 90.0,
        "baseline_gpu_kw": 110.0,
    }
    report = interval_report(event, "flexgate", asked, 0, now, now + timedelta(minutes=5), site)
    assert spec.problems("reportRequest", report) == []
    assert spec.problems("reportRequest", refusal_report("e-1", "flexgate", "why")) == []
    # Without the descriptor's objectType, as flexgate sent it, the schema refuses it.
    del report["payloadDescriptors"][0]["objectType"]
    assert "'objectType' is a required property" in spec.problems("reportRequest", report)[0]


def simple_event_body(now: datetime) -> dict:
    return {
        "id": "e-1",
        "programID": "p-1",
        "intervalPeriod": {"start": now.isoformat(), "duration": "PT5M"},
        "intervals": [{"id": 0, "payloads": [{"type": "SIMPLE", "values": [1]}]}],
    }


# --- what the VEN reads: never acted on when its payload does not validate ----------------

BAD_PAYLOADS = {
    "no type": {"values": [1]},
    "an empty type": {"type": "", "values": [1]},
    "a type too long": {"type": "X" * 129, "values": [1]},
    "no values": {"type": "SIMPLE"},
    "values not a list": {"type": "SIMPLE", "values": 1},
    "a null value": {"type": "SIMPLE", "values": [None]},
    "a list in the values": {"type": "SIMPLE", "values": [[1]]},
    "a point without y": {"type": "SIMPLE", "values": [{"x": 1.0}]},
}


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_an_event_payload_the_specification_refuses_is_refused_by_the_ven(spec, case):
    body = {
        **simple_event_body(datetime.now(UTC)),
        "objectType": "EVENT",
        "createdDateTime": "2025-01-01T00:00:00Z",
        "modificationDateTime": "2025-01-01T00:00:00Z",
    }
    good = {"type": "SIMPLE", "values": [1]}
    assert spec.problems("event", body) == []
    assert Event.model_validate(body).intervals[0].payloads[0].values == [1]
    body["intervals"][0]["payloads"] = [good, BAD_PAYLOADS[case]]
    assert spec.problems("event", body)
    with pytest.raises(ValidationError, match=r"intervals\.0\.payloads\.1"):
        Event.model_validate(body)
