import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.allocate import allocate_mix
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.quote import Delivered, quote
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
    q = quote(parse_job_mix(doc), confidence=0.99, power_uncertainty=0.0)
    assert q["firm_kw"] == pytest.approx(q["achievable_kw"])


def test_overhead_uncertainty_alone_gives_the_normal_bound():
    doc = {
        "overhead_factor": 1.2,
        "overhead_factor_stderr": 0.1,
        "jobs": [
            {"id": "a", "gpus": 8, "power_w": 600, "throughput": 1e4, "pfi": 1.5, "pfi_stderr": 0.0}
        ],
    }
    q = quote(parse_job_mix(doc), confidence=0.9, power_uncertainty=0.0)
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


def one_job_site(**job):
    return {
        "overhead_factor": 1.3,
        "overhead_factor_stderr": 0.0,
        "jobs": [
            {
                "id": "a",
                "gpus": 16,
                "power_w": 600,
                "throughput": 1e4,
                "pfi": 1.5,
                "pfi_stderr": 0.0,
            }
            | job
        ],
    }


def test_the_jobs_power_errors_add_linearly_as_one_common_mode_error():
    """Every GPU off the same way: two jobs' sd of shed add, they do not add in quadrature;
    each job's sd is its share of uncapped power times the uncertainty (its cap holds its
    capped draw), and a measured power carries its own, smaller error."""
    doc = one_job_site()
    doc["jobs"].append(doc["jobs"][0] | {"id": "b"})
    q = quote(parse_job_mix(doc), confidence=0.9, power_uncertainty=0.1)
    sd_w = 0.1 * 16 * 600  # each job's: below its cut of about 16 * 400 W
    assert [j["power_sd_w"] for j in q["jobs"]] == pytest.approx([sd_w, sd_w])
    assert q["uncertainty_kw"]["job_power"] == pytest.approx(1.3 * 2 * sd_w / 1000)
    assert q["firm_kw"] == pytest.approx(
        q["achievable_kw"] - 1.2815515655446004 * 1.3 * 2 * sd_w / 1000
    )
    doc["jobs"][1]["power_stderr_w"] = 6.0  # measured: 1%
    q = quote(parse_job_mix(doc), confidence=0.9, power_uncertainty=0.1)
    assert q["jobs"][1]["power_sd_w"] == pytest.approx(16 * 6.0)
    assert q["uncertainty_kw"]["job_power"] == pytest.approx(1.3 * (sd_w + 16 * 6.0) / 1000)


def test_a_jobs_power_error_costs_at_most_its_whole_cut():
    """A job held near its uncapped power by its QoS floor sheds little; drawing less than
    believed, it sheds nothing, not less than nothing."""
    q = quote(parse_job_mix(one_job_site(min_throughput_fraction=0.97)), power_uncertainty=0.5)
    job = q["jobs"][0]
    assert job["power_sd_w"] == pytest.approx(job["max_reduction_w"])


def delivered(*ratios, requested_kw=10.0):
    return [Delivered(f"ev-{i}", requested_kw, r * requested_kw) for i, r in enumerate(ratios)]


def test_a_site_that_delivered_less_than_planned_quotes_less():
    site = mix()
    plain = quote(site, confidence=0.9)
    history = delivered(1.0, 0.98, 0.7, 1.02, 0.99, 1.0, 0.97, 1.0, 1.01, 0.95)
    q = quote(site, confidence=0.9, history=history)
    factor = float(np.quantile([d.delivered_kw / d.requested_kw for d in history], 0.1))
    assert 0.7 < factor < 0.95  # the worst event weighs, but does not set it alone
    assert q["history"]["factor"] == pytest.approx(factor)
    assert q["history"]["quantile"] == pytest.approx(0.1)
    assert [e["event_id"] for e in q["history"]["events"]] == [d.event_id for d in history]
    assert q["firm_kw"] == pytest.approx(factor * plain["firm_kw"])
    assert q["achievable_kw"] == plain["achievable_kw"]  # the expectation stays the model's
    # Delivering more than asked promises no more than the model; nothing asked, nothing read.
    lucky = quote(site, history=delivered(1.2, 1.3) + delivered(0.5, requested_kw=0.0))
    assert (lucky["firm_kw"], lucky["history"]["factor"]) == (plain["firm_kw"], 1.0)
    assert len(lucky["history"]["events"]) == 2
    assert plain["history"] == {"events": [], "quantile": pytest.approx(0.1), "factor": 1.0}


def test_a_power_uncertainty_outside_0_to_1_is_refused():
    with pytest.raises(FlexModelError, match="power uncertainty"):
        quote(mix(), power_uncertainty=1.0)


@st.composite
def small_mixes(draw):
    jobs = []
    for i in range(draw(st.integers(1, 4))):
        power_w = draw(st.floats(250.0, 690.0))
        job = {
            "id": f"j{i}",
            "gpus": draw(st.sampled_from([1, 8, 16, 64])),
            "power_w": power_w,
            "throughput": 1e4,
            "pfi": draw(st.floats(1.1, 2.7)),
            "pfi_stderr": draw(st.floats(0.0, 0.3)),
            "min_throughput_fraction": draw(st.floats(0.0, 0.95)),
        }
        if draw(st.booleans()):
            job["power_stderr_w"] = draw(st.floats(0.0, 0.2)) * power_w
        jobs.append(job)
    return parse_job_mix(
        {
            "overhead_factor": draw(st.floats(1.0, 1.6)),
            "overhead_factor_stderr": draw(st.floats(0.0, 0.2)),
            "jobs": jobs,
        }
    )


@settings(max_examples=60, deadline=None)
@given(
    site=small_mixes(),
    uncertainty=st.lists(st.floats(0.0, 0.9), min_size=2, max_size=2).map(sorted),
    confidence=st.lists(st.floats(0.5, 0.999), min_size=2, max_size=2).map(sorted),
    ratios=st.lists(st.floats(0.0, 1.5), max_size=6),
)
def test_firm_never_rises_with_the_power_uncertainty_or_the_confidence(
    site, uncertainty, confidence, ratios
):
    def firm(u, c):
        q = quote(
            site,
            confidence=c,
            power_uncertainty=u,
            history=delivered(*ratios),
            points=2,
            per_job_curves=False,
        )
        assert 0.0 <= q["firm_kw"] <= q["achievable_kw"] * (1 + 1e-12)
        return q["firm_kw"]

    (u_low, u_high), (c_low, c_high) = uncertainty, confidence
    assert firm(u_high, c_low) <= firm(u_low, c_low) + 1e-9
    assert firm(u_low, c_high) <= firm(u_low, c_low) + 1e-9
