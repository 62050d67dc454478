"""Promises the site can keep: quotes count only jobs the gateway can cap, and price what the
plan will cost (real gateway and agents on loopback)."""

from __future__ import annotations

import copy

import pytest

from tests.gateway.conftest import API, now_iso


def test_a_quote_and_the_plan_agree_on_the_same_mix(site):
    quoted = site.api.post("/v1/quotes", json={"reduction_kw": 8.0, "window_s": 60}).json()
    assert quoted["requested_feasible"] is True
    body = {"reduction_kw": 8.0, "start": now_iso(), "duration_s": 60}
    event = site.api.post("/v1/events", json=body, headers=API).json()
    plan_id = site.wait(lambda: site.api.get(f"/v1/events/{event['id']}").json()["plan_id"])
    plan = site.acked_plan(plan_id)
    assert plan["throughput_before"] - plan["throughput_after"] == pytest.approx(
        quoted["requested_throughput_loss"], rel=1e-6
    )


def test_jobs_the_gateway_cannot_cap_are_left_out_of_quotes_with_the_reason(site):
    before = site.api.post("/v1/quotes", json={"window_s": 60}).json()
    jobs = site.api.get("/v1/jobs").json()["jobs"]
    stranded = copy.deepcopy(jobs[0])
    stranded["id"] = "on-a-silent-node"
    stranded["placement"] = [{"node": "node-99", "gpus": list(range(stranded["gpus"]))}]
    unplaced = copy.deepcopy(jobs[0])
    unplaced["id"] = "nowhere"
    unplaced.pop("placement")
    body = {"jobs": [*jobs, stranded, unplaced]}
    assert site.api.put("/v1/jobs", json=body, headers=API).status_code == 200
    after = site.api.post("/v1/quotes", json={"window_s": 60}).json()
    why = {j["id"]: j["reason"] for j in after["left_out"]}
    assert why["on-a-silent-node"] == "on node-99, which does not answer"
    assert why["nowhere"] == "no placement: the gateway cannot cap it"
    assert after["achievable_kw"] == pytest.approx(before["achievable_kw"])  # they give nothing
