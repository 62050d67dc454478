"""The gateway API's guards: tokens, bad input, and what a changing job mix does."""

import copy
import time

import pytest

from gateway.api.schemas.health import Health
from tests.conftest import EXAMPLES
from tests.gateway.conftest import API, API_TOKEN, now_iso, running_site
from tests.promtext import samples


@pytest.fixture(params=["sqlite"])
def database_url(request, tmp_path):  # the guards do not depend on the store
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def test_every_mutating_route_needs_the_api_token(site):
    """Enumerated from the OpenAPI document, so no new route slips through."""
    spec = site.api.get("/openapi.json").json()
    writes = [
        (m.upper(), p)
        for p, ops in spec["paths"].items()
        for m in ops
        if m in ("post", "put", "patch", "delete") and p != "/v1/quotes"
    ]
    assert {
        ("PUT", "/v1/jobs"),
        ("POST", "/v1/events"),
        ("DELETE", "/v1/events/{event_id}"),
        ("PUT", "/v1/jobs/{job_id}"),
        ("DELETE", "/v1/jobs/{job_id}"),
    } <= set(writes)
    for method, path in writes:
        concrete = path.replace("{event_id}", "ev-x").replace("{job_id}", "job-x")
        for headers in (
            {},
            {"Authorization": "Bearer not-the-token-0123456789"},
            {"Authorization": API_TOKEN},
        ):
            answer = site.api.request(method, concrete, json={}, headers=headers)
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.json()["detail"]
    assert site.api.post("/v1/quotes", json={}).status_code == 200  # open: it changes nothing


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        (
            "/v1/events",
            {"reduction_kw": 10, "start": "2026-01-01T10:00:00", "duration_s": 60},
            "time zone",
        ),
        (
            "/v1/events",
            {"reduction_kw": -1, "start": "2026-01-01T10:00:00Z", "duration_s": 60},
            "greater than 0",
        ),
        (
            "/v1/events",
            {"reduction_kw": 10, "start": "2020-01-01T10:00:00Z", "duration_s": 60},
            "in the past",
        ),
        ("/v1/events", {"reduction_kw": 10, "start": "soon", "duration_s": 60}, "start"),
        (
            "/v1/events",
            {"reduction_kw": 10, "start": "2026-01-01T10:00:00Z", "duration_s": 60, "priority": 1},
            "priority",
        ),
        (
            "/v1/jobs",
            {"jobs": [{"id": "a", "gpus": 0, "power_w": 600, "throughput": 1}]},
            "'gpus' must be a whole number",
        ),
        ("/v1/jobs", {"jobs": [], "colour": "blue"}, "colour"),
    ],
)
def test_bad_input_is_refused_naming_the_problem_and_changes_nothing(site, path, body, words):
    before = site.api.get("/v1/jobs").json()
    method = "put" if path == "/v1/jobs" else "post"
    answer = getattr(site.api, method)(path, json=body, headers=API)
    assert answer.status_code == 422, answer.text
    assert words in answer.text
    assert site.api.get("/v1/jobs").json() == before
    assert site.api.get("/v1/events").json()["events"] == []


def test_missing_things_are_404_and_ended_events_409(site):
    assert site.api.get("/v1/events/ev-nope").status_code == 404
    assert site.api.get("/v1/plans/plan-nope").status_code == 404
    assert site.api.delete("/v1/jobs/nope", headers=API).status_code == 404
    event = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 5, "start": now_iso(), "duration_s": 60}
    ).json()
    assert site.api.delete(f"/v1/events/{event['id']}", headers=API).status_code == 200
    again = site.api.delete(f"/v1/events/{event['id']}", headers=API)
    assert again.status_code == 409
    assert "cancelled" in again.json()["detail"]


def test_a_job_mix_change_during_an_event_replans_it(site):
    event = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 15, "start": now_iso(), "duration_s": 120}
    ).json()
    first = site.wait(lambda: site.api.get(f"/v1/events/{event['id']}").json()["plan_id"])
    job = copy.deepcopy(site.api.get("/v1/jobs").json()["jobs"][0])
    job["min_throughput_fraction"] = 0.95  # a floor that changes what this job can give
    assert site.api.put(f"/v1/jobs/{job['id']}", json=job, headers=API).status_code == 200
    second = site.api.get(f"/v1/events/{event['id']}").json()["plan_id"]
    assert second != first
    plan = site.api.get(f"/v1/plans/{second}").json()
    row = next(j for j in plan["jobs"] if j["id"] == job["id"])
    assert row["throughput_fraction"] >= 0.95 - 1e-9
    assert plan["generation"] > site.api.get(f"/v1/plans/{first}").json()["generation"]


def test_overlapping_events_the_strictest_target_wins(site):
    small = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 5, "start": now_iso(), "duration_s": 120}
    ).json()
    site.wait(lambda: site.api.get(f"/v1/events/{small['id']}").json()["plan_id"])
    big = site.api.post(
        "/v1/events", headers=API, json={"reduction_kw": 20, "start": now_iso(), "duration_s": 120}
    ).json()
    site.wait(lambda: site.api.get(f"/v1/events/{big['id']}").json()["plan_id"])
    assert site.api.get("/v1/site").json()["active_event_id"] == big["id"]
    site.api.delete(f"/v1/events/{big['id']}", headers=API)
    time.sleep(0.3)
    replan = site.api.get(f"/v1/events/{small['id']}").json()["plan_id"]
    plan = site.api.get(f"/v1/plans/{replan}").json()
    assert plan["requested_facility_kw"] == pytest.approx(5.0)  # back to the remaining event


def metrics(site) -> dict[str, float]:
    return samples(site.api.get("/metrics").text)


def test_metrics_count_the_fan_outs_sent_and_finished(site):
    before = metrics(site)
    assert before["flexgate_agents_known"] == len(site.nodes)
    body = {"reduction_kw": 5, "start": now_iso(), "duration_s": 120}
    event = site.api.post("/v1/events", headers=API, json=body).json()
    plan_id = site.wait(lambda: site.api.get(f"/v1/events/{event['id']}").json()["plan_id"])
    site.wait(
        lambda: all(
            c["status"] != "pending"
            for c in site.api.get(f"/v1/plans/{plan_id}").json()["commands"]
        )
    )
    # The event's fan-out (and the renewals every 0.5 s) finish: counted once answered.
    sent = before["flexgate_fan_outs_total"]
    after = site.wait(lambda: (m := metrics(site))["flexgate_fan_outs_finished_total"] > sent and m)
    assert after["flexgate_fan_outs_total"] > sent
    assert after["flexgate_fan_outs_finished_total"] <= after["flexgate_fan_outs_total"]


def test_health_metrics_and_sync(site):
    health = site.api.get("/health").json()
    assert health["status"] == "ok"
    assert Health.model_validate(health).model_dump(mode="json") == health  # sent as built
    assert health["agents_known"] == len(site.nodes)
    assert "flexgate_agents_known" in site.api.get("/metrics").text
    sync = site.api.get("/v1/sync").json()
    assert {loop["name"] for loop in sync["loops"]} == {"firmware", "gateway"}
    assert sync["verdict"] in ("safe", "at-risk", "unsafe")
    assert set(sync) >= {"jobs", "order_parameters", "alarms", "loops", "verdict"}
    # Two jobs: the Rayleigh test does not apply; the pair's phase-locking value stands in.
    assert sync["alarms"]["test"] == "phase-locking-value"
    assert all(0.0 <= p["plv"] <= 1.0 for p in sync["alarms"]["pairs"])
    assert set(sync["clocks"]) == set(site.nodes)
    # Two jobs: no Rayleigh alarm, so scattering is on guard but idle.
    assert sync["scattering"] == {"mode": "auto", "active": False, "episode": None, "ended": []}
    # The oscillation: per source, within what it sees; no limit set, no alarm.
    oscillation = sync["oscillation"]
    assert oscillation["band_hz"] == [0.1, 20.0]
    assert oscillation["alarm"] is False
    for source in ("meter", "agents"):
        seen = oscillation[source]
        assert (seen["rms_kw"] is None) == (seen["reason"] is not None), seen
    text = site.api.get("/metrics").text  # the check each reconciliation makes
    assert 'flexgate_oscillation_rms_kw{source="agents"}' in samples(text)
    assert samples(text)["flexgate_oscillation_alarm"] == 0
    # Every family says what it is (HELP), as Prometheus's own text format has it.
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    helped = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert families == helped
    nodes = site.api.get("/v1/nodes").json()["nodes"]
    assert all(len(n["gpus"]) == 8 for n in nodes)


def test_quotes_follow_the_job_mix(site):
    first = site.api.post("/v1/quotes", json={"window_s": 60, "reduction_kw": 10}).json()
    assert first["requested_feasible"] is True
    assert site.api.post("/v1/quotes", json={"window_s": 60, "reduction_kw": 10}).json() == first
    jobs = site.api.get("/v1/jobs").json()["jobs"]
    assert site.api.put("/v1/jobs", json={"jobs": jobs[:1]}, headers=API).status_code == 200
    smaller = site.api.post("/v1/quotes", json={"window_s": 60, "reduction_kw": 10}).json()
    assert smaller["achievable_kw"] < first["achievable_kw"]  # the cache followed the mix
    assert site.api.post("/v1/quotes", json={"confidence": 1.5}).status_code == 422


def test_known_nodes_are_stored(site):
    listed = site.api.get("/v1/nodes").json()["nodes"]
    assert {n["node"] for n in listed} == set(site.nodes)
    assert all(n["reachable"] and n["last_seen"] for n in listed)


def test_a_job_placed_on_gpus_another_job_holds_is_refused_and_nothing_is_stored(site):
    """The job-mix reader refuses two jobs on one GPU, so the API does too, whole or one job."""
    before = site.api.get("/v1/jobs").json()
    holder = next(j for j in before["jobs"] if j["placement"][0]["node"] == "node-01")
    intruder = {**copy.deepcopy(holder), "id": "intruder"}
    gpus = intruder["placement"][0]["gpus"]
    one = site.api.put("/v1/jobs/intruder", json=intruder, headers=API)
    whole = site.api.put("/v1/jobs", json={"jobs": [*before["jobs"], intruder]}, headers=API)
    for answer in (one, whole):
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert f"jobs '{holder['id']}' and 'intruder'" in detail
        assert f"node 'node-01' GPU(s) {', '.join(map(str, gpus))}" in detail
    assert site.api.get("/v1/jobs").json() == before


def test_the_job_mix_file_the_cli_reads_is_accepted_with_its_site_fields_named(site):
    """`examples/site.json`, as `flexgate allocate` reads it and as curl -d @ sends it (a form
    Content-Type): its site fields are ignored, each warning naming the setting that decides."""
    raw = (EXAMPLES / "site.json").read_bytes()
    answer = site.api.put(
        "/v1/jobs",
        content=raw,
        headers={**API, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["jobs"] == 9
    assert any("FLEXGATE_OVERHEAD_FACTOR" in w for w in doc["warnings"])
    assert len(site.api.get("/v1/jobs").json()["jobs"]) == 9


def test_with_every_agent_silent_the_site_sheds_nothing_and_health_is_degraded(tmp_path):
    """The baseline counts only jobs whose nodes report: no phantom shed from agents that are
    gone; /health stays 200 (a liveness answer) but says degraded, and why."""
    database = f"sqlite:///{tmp_path / 'gateway.db'}"
    with running_site(
        tmp_path, database, agents="http://127.0.0.1:9/nodes/node-01", telemetry_max_age_s=0.0
    ) as site:
        doc = site.api.get("/v1/site").json()
        assert doc["nodes_reporting"] == 0
        assert doc["baseline_gpu_kw"] == 0.0
        assert doc["shed_facility_kw"] == 0.0
        assert "0 agent(s) reporting" in doc["basis"]["gpu_power_kw"]
        health = site.wait(
            lambda: (r := site.api.get("/health")).json()["status"] == "degraded" and r,
            what="degraded health",
        )
        assert health.status_code == 200
        assert "no agent reports" in health.json()["degraded"][0]


def test_last_seen_follows_the_agents_answers(site):
    first = {n["node"]: n["last_seen"] for n in site.api.get("/v1/nodes").json()["nodes"]}
    site.wait(
        lambda: all(
            n["last_seen"] > first[n["node"]] for n in site.api.get("/v1/nodes").json()["nodes"]
        ),
        what="last_seen moving on",
    )


def test_physical_figures_are_shown_at_their_resolution(site):
    body = {"reduction_kw": 5.0, "start": now_iso(), "duration_s": 60}
    event = site.api.post("/v1/events", json=body, headers=API).json()
    plan_id = site.wait(lambda: site.api.get(f"/v1/events/{event['id']}").json()["plan_id"])
    plan = site.acked_plan(plan_id)
    site_doc = site.api.get("/v1/site").json()
    quote = site.api.post("/v1/quotes", json={"window_s": 60}).json()

    def figures(doc, key=""):
        if isinstance(doc, dict):
            for k, v in doc.items():
                yield from figures(v, k)
        elif isinstance(doc, list):
            for v in doc:
                yield from figures(v, key)
        elif isinstance(doc, float) and key.endswith(("_kw", "_w")):
            yield key, doc

    for key, value in [*figures(plan), *figures(site_doc), *figures(quote)]:
        step = 1e-3 if key.endswith("_kw") else 0.1
        assert abs(value / step - round(value / step)) < 1e-6, (key, value)
