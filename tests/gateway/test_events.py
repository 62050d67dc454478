"""A manual event end to end: plan -> caps on the simulated GPUs -> the site sheds what was
asked -> cancel restores. On SQLite and PostgreSQL."""

import time

import numpy as np
import pytest

from gateway.api.schemas.events import Event, Events
from tests.gateway.conftest import API, lease_ends, now_iso, past_and_renewed, running_site


def measured_shed(site, samples=8):
    values = []
    for _ in range(samples):
        values.append(site.api.get("/v1/site").json()["shed_facility_kw"])
        time.sleep(0.5)
    return float(np.mean(values))


def test_manual_event_end_to_end(site):
    quote = site.api.post("/v1/quotes", json={"window_s": 60}).json()
    asked = round(0.5 * quote["achievable_kw"], 1)
    created = site.api.post(
        "/v1/events",
        headers=API,
        json={"reduction_kw": asked, "start": now_iso(), "duration_s": 120},
    )
    assert created.status_code == 201, created.text
    event_id = created.json()["id"]
    event = site.wait(
        lambda: (e := site.api.get(f"/v1/events/{event_id}").json())["plan_id"] and e,
        what="the event's plan",
    )
    assert event["status"] == "active"
    plan = site.acked_plan(event["plan_id"])
    assert plan["feasible"] is True
    assert plan["expected_facility_kw"] == pytest.approx(asked)
    assert {c["status"] for c in plan["commands"]} == {"acked"}
    assert all(c["delay_s"] > 0 and c["acked_at"] for c in plan["commands"])
    # The caps the plan chose are the caps the GPUs enforce.
    limits = site.limits()
    ends = lease_ends(site.nodes)
    for command in plan["commands"]:
        for cap in command["caps"]:
            assert limits[command["node"]][cap["gpu"]] == pytest.approx(cap["cap_w"], abs=0.1)
    # The agents' telemetry window (5 s) fills with capped power: the shed reaches what was
    # asked; then it holds there, on average.
    site.wait(
        lambda: (
            site.api.get("/v1/site").json()["shed_facility_kw"] == pytest.approx(asked, rel=0.1)
        ),
        what="the shed asked for",
    )
    assert measured_shed(site) == pytest.approx(asked, rel=0.1)
    # The event holds while reconciliation renews the 5 s leases.
    site.wait(lambda: past_and_renewed(site.nodes, ends), what="past the first leases, renewed")
    assert site.limits() == limits
    cancelled = site.api.delete(f"/v1/events/{event_id}", headers=API)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    site.wait(
        lambda: all(w == 700.0 for ws in site.limits().values() for w in ws),
        what="the restore after cancelling",
    )
    # The caps are back a moment before the recovery is over: the list and each event's read
    # below are two reads, so they compare only once nothing is stepping back (on a busy
    # machine one read fell on either side of it).
    site.wait(
        lambda: not site.api.get(f"/v1/events/{event_id}").json()["recovering"],
        what="the recovery's end",
    )
    # The list (sent as built, not validated again) is exactly the documented shape, and shows
    # each event as its own read does.
    later = site.api.post(
        "/v1/events",
        headers=API,
        json={"reduction_kw": 1.0, "start": "2099-01-01T00:00:00Z", "duration_s": 60},
    ).json()
    # Each event read on its own just before and just after the list: an event that did not
    # change between the two (a busy machine can finish a recovery or a delivery sample
    # between any two reads) must be shown by the list exactly as read; one that changed, as
    # one of the two.
    ids = [event_id, later["id"]]
    before = {i: site.api.get(f"/v1/events/{i}").json() for i in ids}
    listed = site.api.get("/v1/events").json()
    after = {i: site.api.get(f"/v1/events/{i}").json() for i in ids}
    assert Events.model_validate(listed).model_dump(mode="json") == listed
    assert Event.model_validate(later).model_dump(mode="json") == later  # as created
    assert cancelled.json() == Event.model_validate(cancelled.json()).model_dump(mode="json")
    shown = {e["id"]: e for e in listed["events"]}
    assert list(shown) == [event_id, later["id"]]  # by start
    for shown_id, doc in shown.items():
        assert doc in (before[shown_id], after[shown_id])
    assert any(before[i] == after[i] for i in ids)  # not a check that cannot fail
    # A page of the list: the last events by start, in the same order; a bad limit is
    # refused naming it, and changes nothing.
    for extra in ("2098-01-01T00:00:00Z", "2097-06-01T00:00:00Z"):
        body = {"reduction_kw": 1.0, "start": extra, "duration_s": 60}
        assert site.api.post("/v1/events", headers=API, json=body).status_code == 201
    every = site.api.get("/v1/events").json()["events"]
    assert [e["start"][:4] for e in every[-3:]] == ["2097", "2098", "2099"]
    for limit in (1, 2, 4, 10):
        page = site.api.get("/v1/events", params={"limit": limit}).json()
        assert page == {"events": every[-limit:]}
    for bad in ("0", "-3", "ten", "10001"):
        answer = site.api.get("/v1/events", params={"limit": bad})
        assert answer.status_code == 422, answer.text
        assert "limit" in answer.text
    assert site.api.get("/v1/events").json()["events"] == every


def test_an_infeasible_event_delivers_the_maximum_and_states_the_shortfall(site):
    created = site.api.post(
        "/v1/events",
        headers=API,
        json={"reduction_kw": 5000.0, "start": now_iso(), "duration_s": 60, "force": True},
    )
    event_id = created.json()["id"]
    event = site.wait(lambda: (e := site.api.get(f"/v1/events/{event_id}").json())["plan_id"] and e)
    plan = site.api.get(f"/v1/plans/{event['plan_id']}").json()
    assert plan["feasible"] is False
    assert plan["shortfall_kw"] == pytest.approx(5000.0 - plan["max_facility_kw"])
    assert plan["achieved_gpu_kw"] == pytest.approx(plan["max_facility_kw"] / 1.3)


def test_the_event_ends_on_time_and_caps_come_back(site):
    created = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 10.0, "start": now_iso(), "duration_s": 2}
    )
    event_id = created.json()["id"]
    site.wait(lambda: any(w < 700 for ws in site.limits().values() for w in ws), what="capping")
    site.wait(
        lambda: site.api.get(f"/v1/events/{event_id}").json()["status"] == "completed",
        what="the end of the event",
    )
    site.wait(
        lambda: all(w == 700.0 for ws in site.limits().values() for w in ws), what="the recovery"
    )


def test_reconciliation_puts_back_a_limit_changed_under_it(site):
    event = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 15, "start": now_iso(), "duration_s": 60}
    ).json()
    limits = site.event_caps(event["id"])
    node, gpu = next((n, g) for n, ws in limits.items() for g, w in enumerate(ws) if w < 700)
    site.nodes[node].backend.set_limit_w(gpu, 650.0)  # someone ran nvidia-smi -pl
    site.wait(
        lambda: site.limits()[node][gpu] == limits[node][gpu],
        what="the reconciliation putting the cap back",
    )


def test_a_recovery_in_progress_shows_in_the_site_and_the_event(tmp_path):
    """After a cancellation the caps step back over the recovery ramp: the site and the event
    say so until every GPU has its limit back."""
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    with running_site(tmp_path, database, recovery_ramp_s=3.0, recovery_steps=3) as site:
        body = {"reduction_kw": 5.0, "start": now_iso(), "duration_s": 600}
        event = site.api.post("/v1/events", json=body, headers=API).json()
        site.event_caps(event["id"])
        site.api.delete(f"/v1/events/{event['id']}", headers=API)
        doc = site.api.get("/v1/site").json()
        assert doc["active_event_id"] is None
        assert doc["recovering"] is True
        assert doc["recovering_from_event_id"] == event["id"]
        assert site.api.get(f"/v1/events/{event['id']}").json()["recovering"] is True
        site.wait(lambda: site.api.get("/v1/site").json()["recovering"] is False, what="the end")
        assert site.api.get(f"/v1/events/{event['id']}").json()["recovering"] is False


def test_an_event_beyond_the_site_is_judged_infeasible_when_it_is_created(site):
    body = {"reduction_kw": 500.0, "start": "2030-01-01T00:00:00Z", "duration_s": 600}
    body["force"] = True  # far beyond the site: refused without it (test_configuration.py)
    event = site.api.post("/v1/events", json=body, headers=API).json()
    assert event["status"] == "pending"
    assert event["feasible"] is False
    assert "can shed at most" in event["reason"]
    modest = {"reduction_kw": 1.0, "start": "2030-01-01T00:00:00Z", "duration_s": 600}
    assert site.api.post("/v1/events", json=modest, headers=API).json()["feasible"] is True


def test_an_events_plans_keep_to_the_ramp_limit_and_say_so(tmp_path, database_url):
    """Through the API on a running gateway: with a ramp-rate limit the event's target is
    reached in steps, a site loop period apart, and released so; the event reports its plans
    against the limits."""
    down, up = 60.0, 120.0  # kW per minute: 0.5 and 1 kW a 0.5 s step
    with running_site(
        tmp_path,
        database_url,
        meter_period_s=0.5,
        ramp_down_kw_per_min=down,
        ramp_up_kw_per_min=up,
    ) as site:
        created = site.api.post(
            "/v1/events",
            headers=API,
            json={"reduction_kw": 3.0, "start": now_iso(), "duration_s": 60},
        )
        assert created.status_code == 201, created.text
        event_id = created.json()["id"]

        def reached() -> dict | None:
            event = site.api.get(f"/v1/events/{event_id}").json()
            plan = site.api.get(f"/v1/plans/{event['plan_id']}").json() if event["plan_id"] else {}
            return event if plan.get("requested_facility_kw", 0) >= 3.0 - 1e-6 else None

        event = site.wait(reached, what="the target reached by the ramp")
        ramp = event["ramp"]
        assert ramp["down_kw_per_min"] == down
        assert ramp["limited_plans"] >= 5  # 3 kW at 0.5 kW a step
        assert 0 < ramp["steepest_down_kw_per_min"] <= down + 1e-6
        assert site.api.delete(f"/v1/events/{event_id}", headers=API).status_code == 200
        site.wait(
            lambda: all(w == 700.0 for ws in site.limits().values() for w in ws),
            what="the release",
        )
        ramp = site.api.get(f"/v1/events/{event_id}").json()["ramp"]
        assert 0 < ramp["steepest_up_kw_per_min"] <= up + 1e-6
        assert Event.model_validate(site.api.get(f"/v1/events/{event_id}").json())
