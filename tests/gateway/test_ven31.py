"""The OpenADR 3.1 VEN against the 3.1 mock VTN, both on real uvicorn servers on loopback:
OAuth2, registration, programs, events by webhook and by polling, reports, the lifecycle
(modification, deletion, the VTN down, token expiry mid-event), and every bad event refused
with the reason and no cap changed. The mock VTN checks every VEN message against the
specification's schema (`openadr3.yaml`, where ../shared is beside the clone) and the 3.1
models: no site here sends one the specification refuses."""

from __future__ import annotations

import contextlib
import copy
import logging
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from flexgate.lab.mockvtn31 import LAB_CLIENT_ID
from flexgate.serve import ServerThread, free_port
from gateway.openadr.webhook31 import CALLBACK_PATH
from tests.gateway.conftest import API, running_site
from tests.gateway.misbehaving_vtn31 import MisbehavingVtn31
from tests.gateway.test_ven import on_the_minute

VEN_NAME = "flexgate-test"
#: The mock VTN's client secret in these tests (the lab's is refused outside the lab).
SECRET = "ven31-test-client-secret"


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@contextlib.contextmanager
def mock_vtn(**options):
    vtn = MisbehavingVtn31(**{"clients": {LAB_CLIENT_ID: SECRET}, **options})
    with ServerThread(vtn.app) as url:
        vtn.url = url
        vtn.program = vtn.add_program({"programName": "flexgate-dr"})
        yield vtn


@contextlib.contextmanager
def ven_site(tmp_path, database_url, vtn, webhook=True, **changes):
    port = free_port()
    settings = {
        "openadr": "3.1",
        "vtn_url": vtn.url,
        "vtn_client_id": LAB_CLIENT_ID,
        "vtn_client_secret": SECRET,
        "vtn_allow_http": True,
        "vtn_poll_s": 30.0 if webhook else 0.5,
        "ven_callback_url": f"http://127.0.0.1:{port}{CALLBACK_PATH}" if webhook else "",
        "ven_name": VEN_NAME,
        "ven_resources": "site-a",
        "recovery_ramp_s": 0.2,
        "recovery_steps": 1,
        # These tests read the VEN, not the site's promise: with the declared jobs' common-mode
        # power error (15%) the example site can promise less than SIMPLE level 3 (40%) asks,
        # and would opt out of it (docs/model.md section 7).
        "declared_power_uncertainty": 0.0,
        **changes,
    }
    with running_site(tmp_path, database_url, gateway_port=port, **settings) as site:
        site.wait(
            lambda: site.api.get("/health").json()["ven"] == "registered",
            what="the VEN's registration",
        )
        if webhook:
            site.wait(lambda: vtn.subscriptions, what="the subscription")
        yield site
    by_schema = [why for why in vtn.refused if "(the specification)" in why]
    assert by_schema == [], f"the VEN sent what the specification refuses: {by_schema}"


def simple_event(vtn, level=2, start_s=1.0, interval_s=3.0, intervals=2, **extra):
    start = datetime.now(UTC) + timedelta(seconds=start_s)
    return {
        "programID": vtn.program["id"],
        "eventName": "shed",
        "intervalPeriod": {"start": start.isoformat(), "duration": f"PT{interval_s}S"},
        "intervals": [
            {"id": i, "payloads": [{"type": "SIMPLE", "values": [level]}]} for i in range(intervals)
        ],
        **extra,
    }


def stored(site, event_id):
    answer = site.api.get(f"/v1/events/oadr3-{event_id}")
    return answer.json() if answer.status_code == 200 else None


def capped(site):
    return any(w < 700 for ws in site.limits().values() for w in ws)


def uncapped(site):
    return all(w == 700.0 for ws in site.limits().values() for w in ws)


@pytest.fixture
def vtn():
    with mock_vtn() as vtn:
        yield vtn


@pytest.fixture
def site(tmp_path, database_url, vtn):
    with ven_site(tmp_path, database_url, vtn) as site:
        yield site


def test_the_ven_registers_itself_and_its_resources_and_subscribes(site, vtn):
    [ven] = vtn.vens.values()
    assert ven["venName"] == VEN_NAME
    assert ven["clientID"] == LAB_CLIENT_ID
    assert [r["resourceName"] for r in vtn.resources.values()] == ["site-a"]
    assert all(r["venID"] == ven["id"] for r in vtn.resources.values())
    [subscription] = vtn.subscriptions.values()
    [hook] = subscription["objectOperations"]
    assert "EVENT" in hook["objects"]
    assert hook["callbackUrl"].endswith(CALLBACK_PATH)
    assert hook["bearerToken"]
    assert vtn.refused == []


def test_an_event_by_webhook_becomes_caps_and_interval_reports(site, vtn):
    asked = ["DEMAND", "USAGE", "BASELINE", "DELTA_USAGE", "READING"]  # READING: not sent
    body = simple_event(vtn, interval_s=5.0, reportDescriptors=[{"payloadType": t} for t in asked])
    event = vtn.add_event(body)
    # Polls are 30 s apart: only the webhook can bring it this soon.
    got = site.wait(lambda: stored(site, event["id"]), seconds=10, what="the event by webhook")
    assert vtn.delivered[-1][1] == 200
    assert got["source"] == "openadr"
    assert got["opt"] == "in"
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    assert got["reduction_kw"] == pytest.approx(0.25 * baseline, abs=1e-3)  # SIMPLE 2: 25%
    site.wait(lambda: capped(site), what="caps")
    site.wait(lambda: stored(site, event["id"])["status"] == "completed", what="the end")
    site.wait(lambda: uncapped(site), what="the restore")
    reports = site.wait(
        lambda: (
            (r := [r for r in vtn.reports if "interval" in r["reportName"]]) and len(r) == 2 and r
        ),
        seconds=30,
        what="a report per interval",
    )
    assert vtn.refused == []
    assert [r["resources"][0]["intervals"][0]["id"] for r in reports] == [0, 1]
    first = reports[0]
    assert first["eventID"] == event["id"]
    assert first["clientName"] == VEN_NAME
    assert {d["payloadType"]: d["units"] for d in first["payloadDescriptors"]} == {
        "DEMAND": "KW",
        "USAGE": "KWH",
        "BASELINE": "KW",
        "DELTA_USAGE": "KW",
    }
    assert {r["resourceName"] for r in first["resources"]} == {"FACILITY", "GPUS"}

    def values(report, resource):
        [where] = [r for r in report["resources"] if r["resourceName"] == resource]
        return {p["type"]: p["values"][0] for p in where["intervals"][0]["payloads"]}

    k = site.api.get("/v1/site").json()["overhead_factor"]
    for report in reports:  # each the site as GET /v1/site showed it at the interval's end
        facility, gpus = values(report, "FACILITY"), values(report, "GPUS")
        assert facility["USAGE"] == pytest.approx(facility["DEMAND"] * 5.0 / 3600, abs=1e-3)
        assert facility["BASELINE"] == pytest.approx(baseline, rel=1e-3)
        shed = -facility["DELTA_USAGE"]
        assert shed == pytest.approx(
            facility["BASELINE"] - facility["DEMAND"], abs=2e-3
        )  # each rounded to 1 W
        assert facility["DEMAND"] == pytest.approx(k * gpus["DEMAND"], rel=1e-2)  # no static kW
    # By the end of the second interval the agents' telemetry window shows the caps.
    assert -values(reports[-1], "FACILITY")["DELTA_USAGE"] > 0.1 * baseline  # 25% asked


def test_a_modified_event_is_read_again(site, vtn):
    event = vtn.add_event(simple_event(vtn, level=1, start_s=0.5, interval_s=30, intervals=1))
    site.wait(lambda: (s := stored(site, event["id"])) and s["status"] == "active", what="start")
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    changed = copy.deepcopy(event["intervals"])
    changed[0]["payloads"][0]["values"] = [3]
    vtn.update_event(event["id"], {"intervals": changed})
    site.wait(
        lambda: stored(site, event["id"])["reduction_kw"] == pytest.approx(0.40 * baseline, 1e-3),
        what="the new value",
    )
    assert stored(site, event["id"])["status"] in ("pending", "active")


def test_a_modification_with_new_intervals_replaces_the_schedule(site, vtn):
    event = vtn.add_event(simple_event(vtn, level=1, start_s=30, interval_s=30, intervals=1))
    site.wait(lambda: stored(site, event["id"]), what="the event")
    assert len(stored(site, event["id"])["intervals"]) == 1
    longer = simple_event(vtn, level=2, start_s=30, interval_s=30, intervals=1)["intervals"]
    longer.append({"id": 1, "payloads": [{"type": "SIMPLE", "values": [3]}]})
    vtn.update_event(event["id"], {"intervals": longer})
    got = site.wait(
        lambda: (s := stored(site, event["id"])) and len(s["intervals"]) == 2 and s,
        what="the new schedule",
    )
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    assert [i["reduction_kw"] for i in got["intervals"]] == pytest.approx(
        [0.25 * baseline, 0.40 * baseline], rel=1e-3
    )
    assert got["status"] == "pending"


def test_cancelling_a_31_event_on_the_site_restores_and_tells_the_vtn(site, vtn):
    event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
    site.wait(lambda: capped(site), what="caps")
    answer = site.api.delete(f"/v1/events/oadr3-{event['id']}", headers=API)
    assert answer.status_code == 200
    assert answer.json()["status"] == "cancelled"
    assert answer.json()["opt"] == "out"
    told = site.wait(
        lambda: [r for r in vtn.reports if r["eventID"] == event["id"]], what="the VTN told"
    )
    assert "cancelled on the site" in told[0]["reportName"]
    site.wait(lambda: uncapped(site), what="the restore")


def test_a_deleted_event_is_cancelled_and_the_caps_restored(site, vtn):
    event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
    site.wait(lambda: capped(site), what="caps")
    vtn.delete_event(event["id"])
    assert stored(site, event["id"])["status"] == "cancelled"  # answered before the VTN goes on
    site.wait(lambda: uncapped(site), what="the restore")


def test_without_a_webhook_the_ven_polls_and_an_unlisted_event_is_cancelled(
    tmp_path, database_url, vtn
):
    with ven_site(tmp_path, database_url, vtn, webhook=False) as site:
        assert vtn.subscriptions == {}
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps from a poll")
        vtn.delete_event(event["id"])
        site.wait(lambda: stored(site, event["id"])["status"] == "cancelled", what="cancelled")
        site.wait(lambda: uncapped(site), what="the restore")


def _bad(vtn, change):
    body = simple_event(vtn, start_s=0.5, interval_s=60, intervals=1)
    change(body)
    return body


BAD_EVENTS = {
    "a value of the wrong type": (
        lambda b: b["intervals"][0]["payloads"][0].update(values=["two"]),
        "'two' is not a number",
    ),
    "an interval id of the wrong type": (
        lambda b: b["intervals"][0].update(id="first"),
        "not an OpenADR 3.1 event: intervals.0.id",
    ),
    "no intervals": (lambda b: b.update(intervals=[]), "no intervals"),
    "intervals missing": (lambda b: b.pop("intervals"), "no intervals"),
    "a negative duration": (
        lambda b: b["intervalPeriod"].update(duration="-PT60S"),
        "is negative",
    ),
    "no programID": (lambda b: b.pop("programID"), "programID"),
}


@pytest.mark.parametrize("case", list(BAD_EVENTS))
def test_a_bad_event_is_refused_with_the_reason_and_no_cap_changes(site, vtn, case):
    change, reason = BAD_EVENTS[case]
    event = vtn.add_raw_event(_bad(vtn, change))
    got = site.wait(lambda: stored(site, event["id"]), what="the refusal")
    assert got["status"] == "failed"
    assert got["opt"] == "out"
    assert reason in got["reason"]
    told = site.wait(
        lambda: [r for r in vtn.reports if r["eventID"] == event["id"]], what="the VTN told"
    )
    assert reason in told[0]["reportName"]
    payload = told[0]["resources"][0]["intervals"][0]["payloads"][0]
    assert payload == {"type": "OPERATING_STATE", "values": ["RUNNING_OPTED_OUT"]}
    assert uncapped(site)
    assert vtn.refused == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda b: b["intervals"][0].update(payloads=[{"type": "PRICE", "values": [0.3]}]),
            "PRICE: not a payload flexgate acts on",
        ),
        (lambda b: b.update(targets=["VEN-99"]), "not targeted at this VEN (targets: VEN-99)"),
    ],
    ids=["an unknown payload type", "a target for another VEN"],
)
def test_an_event_flexgate_does_not_act_on_is_an_opt_out_with_the_reason(site, vtn, change, reason):
    event = vtn.add_event(_bad(vtn, change))
    got = site.wait(lambda: stored(site, event["id"]), what="the event")
    assert got["status"] == "opted_out"
    assert reason in got["reason"]
    site.wait(lambda: [r for r in vtn.reports if r["eventID"] == event["id"]], what="the report")
    assert uncapped(site)


def test_the_webhook_refuses_a_notification_without_the_subscriptions_token(site, vtn):
    url = next(iter(vtn.subscriptions.values()))["objectOperations"][0]["callbackUrl"]
    token = next(iter(vtn.subscriptions.values()))["objectOperations"][0]["bearerToken"]
    note = {
        "objectType": "EVENT",
        "operation": "CREATE",
        "object": {**simple_event(vtn, start_s=0.5, interval_s=60, intervals=1), "id": "forged"},
    }
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        answer = httpx.post(url, json=note, headers=headers)
        assert answer.status_code == 401
        assert "bearer token" in answer.json()["detail"]
    answer = httpx.post(
        url, json={"objectType": "EVENT"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 400
    assert "operation" in answer.json()["detail"]
    assert stored(site, "forged") is None
    assert uncapped(site)


def test_a_notification_in_30s_http_verbs_is_read_as_its_crud_operation(site, vtn):
    """POST / PUT (3.0's names) are CREATE / UPDATE: a PUT of a newer version updates."""
    event = vtn.add_event(simple_event(vtn, level=1, start_s=30, interval_s=30, intervals=1))
    site.wait(lambda: stored(site, event["id"]), what="the event")
    [hook] = next(iter(vtn.subscriptions.values()))["objectOperations"]
    newer = copy.deepcopy(event)
    newer["intervals"][0]["payloads"][0]["values"] = [3]
    newer["modificationDateTime"] = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    answer = httpx.post(
        hook["callbackUrl"],
        json={"objectType": "EVENT", "operation": "PUT", "object": newer},
        headers={"Authorization": f"Bearer {hook['bearerToken']}"},
    )
    assert answer.status_code == 200  # answered first, acted on after
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    site.wait(
        lambda: stored(site, event["id"])["reduction_kw"] == pytest.approx(0.40 * baseline, 1e-3),
        what="the update",
    )


def test_a_late_event_acts_at_once_and_one_already_over_is_not_acted_on(site, vtn):
    late = vtn.add_event(simple_event(vtn, start_s=-5.0, interval_s=60, intervals=1))
    site.wait(lambda: capped(site), what="caps for the late event")
    assert stored(site, late["id"])["status"] == "active"
    over = vtn.add_event(simple_event(vtn, start_s=-60.0, interval_s=10, intervals=1))
    got = site.wait(lambda: stored(site, over["id"]), what="the past event")
    assert got["status"] == "opted_out"
    assert "every interval has ended" in got["reason"]


def test_overlapping_events_hold_the_strictest(site, vtn):
    mild = vtn.add_event(simple_event(vtn, level=1, start_s=0.5, interval_s=60, intervals=1))
    strict = vtn.add_event(simple_event(vtn, level=3, start_s=0.5, interval_s=60, intervals=1))
    baseline = site.api.get("/v1/site").json()["baseline_facility_kw"]
    for event in (mild, strict):
        site.wait(lambda e=event: stored(site, e["id"])["status"] == "active", what="both active")

    def strict_plan():
        plan_id = stored(site, strict["id"])["plan_id"]
        return plan_id and site.api.get(f"/v1/plans/{plan_id}").json()

    plan = site.wait(strict_plan, what="the strictest event's plan")
    assert plan["requested_facility_kw"] == pytest.approx(0.40 * baseline, rel=1e-3)


def test_while_the_vtn_is_down_stored_events_run_and_end_on_time(tmp_path, database_url, vtn):
    with ven_site(tmp_path, database_url, vtn, vtn_poll_s=0.3) as site:
        demand = [{"payloadType": "DEMAND"}]
        event = vtn.add_event(
            simple_event(vtn, start_s=1.0, interval_s=2, intervals=2, reportDescriptors=demand)
        )
        site.wait(lambda: stored(site, event["id"]), what="the event")
        vtn.down = True
        site.wait(
            lambda: site.api.get("/health").json()["ven"] == "registered, VTN unreachable",
            what="the VEN noticing",
        )
        site.wait(lambda: capped(site), what="caps while the VTN is down")
        site.wait(lambda: stored(site, event["id"])["status"] == "completed", what="its end")
        site.wait(lambda: uncapped(site), what="the restore, on time")
        vtn.down = False
        site.wait(
            lambda: site.api.get("/health").json()["ven"] == "registered",
            seconds=20,
            what="the VEN back",
        )
        # The reports of the intervals that ended meanwhile were kept, and arrive now.
        reports = site.wait(
            lambda: (
                (r := [x for x in vtn.reports if x["eventID"] == event["id"]]) and len(r) == 2 and r
            ),
            what="the kept reports",
        )
        assert [r["resources"][0]["intervals"][0]["id"] for r in reports] == [0, 1]


def test_the_token_is_refreshed_before_it_expires_mid_event(tmp_path, database_url):
    with (
        mock_vtn(token_lifetime_s=3.0) as vtn,
        ven_site(tmp_path, database_url, vtn, webhook=False, vtn_poll_s=0.3) as site,
    ):
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=5, intervals=2))
        site.wait(lambda: capped(site), what="caps")
        granted = vtn.grants
        site.wait(lambda: vtn.grants >= granted + 2, what="new tokens during the event")
        assert vtn.rejected_tokens == 0  # each was replaced before it expired
        assert stored(site, event["id"])["status"] == "active"
        site.wait(lambda: stored(site, event["id"])["status"] == "completed", what="its end")
        assert site.api.get("/health").json()["ven"] == "registered"


def test_a_token_the_vtn_revokes_early_is_replaced_at_the_next_request(tmp_path, database_url, vtn):
    with ven_site(tmp_path, database_url, vtn, webhook=False, vtn_poll_s=0.3) as site:
        granted = vtn.grants
        vtn.revoke_tokens()  # long before the lifetime it stated (an hour)
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps from the next poll")
        assert vtn.rejected_tokens >= 1
        assert vtn.grants == granted + 1
        assert stored(site, event["id"])["status"] == "active"
        assert site.api.get("/health").json()["ven"] == "registered"


def test_the_client_secret_is_never_logged(tmp_path, database_url, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "a-secret-never-logged-0123"
    with (
        mock_vtn(clients={LAB_CLIENT_ID: secret}) as vtn,
        ven_site(tmp_path, database_url, vtn, vtn_client_secret=secret) as site,
    ):
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps")
        answer = site.api.delete(f"/v1/events/oadr3-{event['id']}", headers=API)
        assert answer.status_code == 200
    assert caplog.records
    assert secret not in caplog.text


def test_a_ven_with_the_wrong_secret_is_refused_and_says_why(tmp_path, database_url, vtn, caplog):
    caplog.set_level(logging.WARNING, logger="flexgate.ven31")
    with running_site(
        tmp_path,
        database_url,
        openadr="3.1",
        vtn_url=vtn.url,
        vtn_client_id=LAB_CLIENT_ID,
        vtn_client_secret="not-the-secret-0123456",
        vtn_allow_http=True,
        vtn_poll_s=0.3,
    ) as site:
        site.wait(lambda: "refused client" in caplog.text, what="the refusal logged")
        assert site.api.get("/health").json()["ven"] == "registering"
    assert "not-the-secret-0123456" not in caplog.text
    assert vtn.vens == {}


def test_a_vtn_that_refuses_the_subscription_is_polled(tmp_path, database_url, vtn, caplog):
    caplog.set_level(logging.WARNING, logger="flexgate.ven31")
    vtn.subscribable = False
    callback = "http://127.0.0.1:9/openadr3/notifications"
    with ven_site(
        tmp_path, database_url, vtn, webhook=False, vtn_poll_s=0.3, ven_callback_url=callback
    ) as site:
        event = vtn.add_event(simple_event(vtn, start_s=0.5, interval_s=60, intervals=1))
        site.wait(lambda: capped(site), what="caps from a poll")
        assert stored(site, event["id"])["status"] == "active"
    assert vtn.subscriptions == {}
    assert caplog.text.count("no webhook subscription") == 1  # said once, not every poll
    assert "subscriptions are not offered" in caplog.text


def test_the_mock_vtn_refuses_a_report_the_31_schema_forbids(vtn):
    token = httpx.post(
        f"{vtn.url}/auth/token",
        data={"grant_type": "client_credentials"},
        auth=(LAB_CLIENT_ID, SECRET),
    ).json()["access_token"]
    answer = httpx.post(
        f"{vtn.url}/reports",
        json={"eventID": "1", "resources": []},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 400
    assert "clientName" in answer.json()["detail"]
    assert vtn.refused


def test_under_the_programs_rule_the_facility_reports_its_settlement_and_logs_what_is_missing(
    tmp_path, database_url, vtn, caplog
):
    """FLEXGATE_REPORT_BASELINE 10of10 on a site with no history before today: the interval's
    metered load, estimated (no meter), as its settlement serves it; no baseline, so neither
    BASELINE nor DELTA_USAGE, and the log says why. One-minute settlement intervals and an
    event of one minute on the minute (`on_the_minute`): the test waits for it to close."""
    caplog.set_level(logging.WARNING, logger="flexgate.ven31")
    options = {"report_baseline": "10of10", "settlement_interval_min": 1}
    with ven_site(tmp_path, database_url, vtn, **options) as site:
        start = on_the_minute(datetime.now(UTC))
        asked = [{"payloadType": t} for t in ("DEMAND", "USAGE", "BASELINE", "DELTA_USAGE")]
        body = simple_event(vtn, interval_s=60.0, intervals=1, reportDescriptors=asked)
        body["intervalPeriod"]["start"] = start.isoformat()
        event = vtn.add_event(body)
        [report] = site.wait(
            lambda: [r for r in vtn.reports if "interval" in r["reportName"]],
            seconds=150,
            what="the interval's report",
        )
        served = site.api.get(
            f"/v1/events/oadr3-{event['id']}/settlement", params={"rules": "10of10"}
        ).json()
    [row] = served["rules"][0]["intervals"]
    assert datetime.fromisoformat(row["start"]) == start
    [facility] = [r for r in report["resources"] if r["resourceName"] == "FACILITY"]
    figures = {
        i["payloads"][0]["type"]: (i["payloads"][0]["values"][0], i["payloads"][1]["values"][0])
        for i in facility["intervals"]
    }
    assert figures == {
        "DEMAND": (pytest.approx(row["metered_kw"], abs=1e-3), "ESTIMATED"),
        "USAGE": (pytest.approx(row["metered_kw"] / 60, abs=1e-3), "ESTIMATED"),
    }
    assert row["baseline_kw"] is None
    assert "what 10of10 cannot give: 0 eligible days, 10 needed" in caplog.text
