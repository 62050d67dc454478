import copy
import json

import numpy as np
import pytest

from flexmodel.allocate import allocate_mix
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.quote import quote
from tests.conftest import EXAMPLES

SITE = json.loads((EXAMPLES / "site.json").read_text())


def mix(**site):
    doc = copy.deepcopy(SITE)
    doc.update(site)
    return parse_job_mix(doc)


def test_supply_curve_is_increasing_and_ends_at_achievable():
    q = quote(mix(), window_s=60)
    kw = [p["facility_kw"] for p in q["supply_curve"]]
    loss = [p["throughput_loss"] for p in q["supply_curve"]]
    assert kw[0] == 0.0
    assert loss[0] == 0.0
    assert np.all(np.diff(kw) > 0)
    assert np.all(np.diff(loss) >= 0)
    assert kw[-1] == pytest.approx(q["achievable_kw"])
    for job in q["jobs"]:
        assert np.all(np.diff([p["facility_kw"] for p in job["supply_curve"]]) >= -1e-12)
        assert np.all(np.diff([p["throughput_loss"] for p in job["supply_curve"]]) >= -1e-9)
    # Per-job curves add up to the site's.
    total = np.sum([[p["facility_kw"] for p in j["supply_curve"]] for j in q["jobs"]], axis=0)
    np.testing.assert_allclose(total, kw)


def test_quote_and_allocate_agree_on_what_is_feasible():
    site = mix()
    q = quote(site, window_s=60)  # every job runs longer than a minute
    limit = allocate_mix(site, 1.0)["max_facility_kw"]
    assert q["achievable_kw"] == pytest.approx(limit)
    for asked in (0.5 * limit, 0.999 * limit, 1.001 * limit, 2 * limit):
        q = quote(site, window_s=60, reduction_kw=asked)
        assert q["requested_feasible"] == allocate_mix(site, asked)["feasible"]
    loss = quote(site, window_s=60, reduction_kw=0.5 * limit)["requested_throughput_loss"]
    answer = allocate_mix(site, 0.5 * limit)
    assert loss == pytest.approx(answer["throughput_before"] - answer["throughput_after"])


def test_jobs_ending_inside_the_window_do_not_count():
    site = mix()
    short = quote(site, window_s=60)
    long = quote(site, window_s=3600)  # qwen3-30b-a3b-ft-x8 has 3000 s left
    assert long["jobs_counted"] == short["jobs_counted"] - 1
    assert long["achievable_kw"] < short["achievable_kw"]
    ending = next(j for j in long["jobs"] if j["id"] == "qwen3-30b-a3b-ft-x8")
    assert ending["counted"] is False
    assert ending["max_reduction_w"] == 0.0


def test_firm_is_below_achievable_and_falls_with_confidence():
    site = mix()
    firms = [quote(site, confidence=c)["firm_kw"] for c in (0.5, 0.8, 0.9, 0.99)]
    achievable = quote(site)["achievable_kw"]
    assert firms[0] == pytest.approx(achievable)  # at 50% the expected shed is the median
    assert all(f <= achievable + 1e-12 for f in firms)
    assert np.all(np.diff(firms) < 0)


def test_without_uncertainty_firm_equals_achievable():
    doc = copy.deepcopy(SITE)
    doc["overhead_factor_stderr"] = 0.0
    for job in doc["jobs"]:
        job["pfi_stderr"] = 0.0
    q = quote(parse_job_mix(doc), confidence=0.99)
    assert q["firm_kw"] == pytest.approx(q["achievable_kw"])


def test_overhead_uncertainty_alone_gives_the_normal_bound():
    doc = {
        "overhead_factor": 1.2,
        "overhead_factor_stderr": 0.1,
        "jobs": [
            {"id": "a", "gpus": 8, "power_w": 600, "throughput": 1e4, "pfi": 1.5, "pfi_stderr": 0.0}
        ],
    }
    q = quote(parse_job_mix(doc), confidence=0.9)
    shed_gpu_kw = q["achievable_kw"] / 1.2
    assert q["firm_kw"] == pytest.approx((1.2 - 1.2815515655446004 * 0.1) * shed_gpu_kw)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_s": 0.0}, "window"),
        ({"window_s": float("nan")}, "window"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": 0.0}, "confidence"),
        ({"reduction_kw": -1.0}, "reduction"),
    ],
)
def test_bad_quote_parameters_are_refused(kwargs, message):
    with pytest.raises(FlexModelError, match=message):
        quote(mix(), **kwargs)


def test_every_point_of_the_supply_curve_costs_what_allocate_costs_there():
    """The curve is priced by `optimal`'s own cuts (repaired on non-concave curves), so a
    trader quoting a point pays what the plan will cost, not the unrepaired hull's price."""
    site = mix()
    q = quote(site, window_s=60)
    for point in q["supply_curve"][1:-1]:
        answer = allocate_mix(site, point["facility_kw"])
        cost = answer["throughput_before"] - answer["throughput_after"]
        assert point["throughput_loss"] == pytest.approx(cost, rel=1e-9, abs=1e-6)


def test_jobs_left_out_give_nothing_and_say_why():
    site = mix()
    everyone = quote(site, window_s=60)
    gone = site.jobs[0].id
    q = quote(site, window_s=3600, left_out={gone: "on node-01, which does not answer"})
    assert q["achievable_kw"] < everyone["achievable_kw"]
    why = {entry["id"]: entry["reason"] for entry in q["left_out"]}
    assert why[gone] == "on node-01, which does not answer"
    assert why["qwen3-30b-a3b-ft-x8"].startswith("ends in 3000 s, before the 3600 s window")
    row = next(j for j in q["jobs"] if j["id"] == gone)
    assert (row["counted"], row["max_reduction_w"], row["reason"]) == (
        False,
        0.0,
        "on node-01, which does not answer",
    )
