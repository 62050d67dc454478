import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flexmodel.allocate import allocate, allocate_mix
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from tests.flexmodel.helpers import lp_min_loss, milp_min_loss, pwl_problem

# Two linear jobs: A (2 GPUs, 600 W, 1000 tok/s, PFI 10/9) and B (1 GPU, 400 W, 2000, PFI 1).
LINEAR = [(2, [200.0, 600.0], [400.0, 1000.0]), (1, [200.0, 400.0], [1000.0, 2000.0])]


def _cuts(result, problem):
    return problem.gpus * (problem.hi_w - result.power_w)


def test_equal_takes_the_same_fraction_of_power_by_hand():
    problem = pwl_problem(LINEAR)
    result = allocate(problem, 200.0, "equal")
    # alpha * (2*600 + 400) = 200 -> alpha = 0.125: A gives 150 W, B 50 W.
    np.testing.assert_allclose(_cuts(result, problem), [150.0, 50.0])
    np.testing.assert_allclose(result.power_w, [525.0, 350.0])
    np.testing.assert_allclose(result.throughput, [1000 - 75 * 1.5, 2000 - 50 * 5])


def test_equal_redistributes_what_a_bound_blocks():
    problem = pwl_problem(LINEAR)
    result = allocate(problem, 900.0, "equal")
    # alpha = 900/1600 would take 225 W from B, but B can give only 200: A gives the rest.
    np.testing.assert_allclose(_cuts(result, problem), [700.0, 200.0])


def test_pfi_shares_by_hand():
    problem = pwl_problem(LINEAR)
    problem = type(problem)(**{**problem.__dict__, "pfi": np.array([10 / 9, 1.0])})
    result = allocate(problem, 200.0, "pfi")
    share = np.array([2 * 600 * (10 / 9) / 1000, 1 * 400 * 1.0 / 2000])
    np.testing.assert_allclose(_cuts(result, problem), 200.0 * share / share.sum())


def test_optimal_cuts_the_cheapest_watts_first():
    problem = pwl_problem(LINEAR)
    # A loses 1.5 tok/s per W, B 5: A gives everything it can before B gives anything.
    result = allocate(problem, 900.0, "optimal")
    np.testing.assert_allclose(_cuts(result, problem), [800.0, 100.0])
    assert result.optimality_gap_bound == pytest.approx(0.0, abs=1e-9)
    equal = allocate(problem, 900.0, "equal")
    assert equal.optimality_gap_bound == pytest.approx(result.value - equal.value)


def test_infeasible_delivers_the_maximum_and_says_so():
    problem = pwl_problem(LINEAR)
    for strategy in ("equal", "pfi", "optimal"):
        result = allocate(problem, 5000.0, strategy)
        assert not result.feasible
        assert result.max_w == pytest.approx(1000.0)
        assert result.achieved_w == pytest.approx(1000.0)
        np.testing.assert_allclose(result.power_w, [200.0, 200.0])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_reductions_are_refused(bad):
    with pytest.raises(FlexModelError, match="reduction"):
        allocate(pwl_problem(LINEAR), bad, "optimal")


def test_unknown_strategy_is_refused():
    with pytest.raises(FlexModelError, match="unknown strategy 'fair'"):
        allocate(pwl_problem(LINEAR), 1.0, "fair")


# --- property tests ----------------------------------------------------------------------


@st.composite
def pwl_jobs(draw, concave: bool, max_jobs: int = 8):
    jobs = []
    for _ in range(draw(st.integers(1, max_jobs))):
        k = draw(st.integers(2, 5))
        widths = draw(st.lists(st.floats(5.0, 150.0), min_size=k - 1, max_size=k - 1))
        slopes = draw(st.lists(st.floats(0.0, 50.0), min_size=k - 1, max_size=k - 1))
        if concave:
            slopes = sorted(slopes, reverse=True)  # dx/dp falls as p rises
        p = np.concatenate([[200.0], 200.0 + np.cumsum(widths)])
        x = np.concatenate([[draw(st.floats(10.0, 1000.0))], np.zeros(k - 1)])
        x[1:] = x[0] + np.cumsum(np.array(slopes) * np.array(widths))
        jobs.append((draw(st.integers(1, 16)), list(p), list(x)))
    return jobs


def _max_cut(jobs):
    return sum(g * (p[-1] - p[0]) for g, p, _ in jobs)


def _tolerance(jobs):
    """Solver tolerance scaled to the largest loss the instance allows (HiGHS works to ~1e-7)."""
    return 1e-6 * (1.0 + sum(x[-1] - x[0] for _, _, x in jobs))


@settings(max_examples=150, deadline=None)
@given(jobs=pwl_jobs(concave=True), share=st.floats(0.0, 1.0))
def test_optimal_equals_the_lp_optimum_on_concave_curves(jobs, share):
    reduction = share * _max_cut(jobs)
    problem = pwl_problem(jobs)
    result = allocate(problem, reduction, "optimal")
    loss = result.value_before - result.value
    assert loss == pytest.approx(lp_min_loss(jobs, reduction), abs=_tolerance(jobs))
    assert result.optimality_gap_bound == pytest.approx(0.0, abs=_tolerance(jobs))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=pwl_jobs(concave=False, max_jobs=12), share=st.floats(0.0, 1.0))
def test_optimal_is_within_its_gap_bound_of_the_milp_optimum(jobs, share):
    reduction = share * _max_cut(jobs)
    result = allocate(pwl_problem(jobs), reduction, "optimal")
    loss = result.value_before - result.value
    best = milp_min_loss(jobs, reduction)
    tol = _tolerance(jobs)
    assert loss >= best - tol  # nothing beats the exact optimum
    assert loss - best <= result.optimality_gap_bound + tol


@settings(max_examples=150, deadline=None)
@given(
    jobs=pwl_jobs(concave=False),
    share=st.floats(0.0, 1.2),
    objective=st.sampled_from(["throughput", "gpu_fraction"]),
)
def test_every_strategy_meets_the_target_within_bounds(jobs, share, objective):
    problem = pwl_problem(jobs)
    reduction = share * _max_cut(jobs)
    results = {s: allocate(problem, reduction, s, objective) for s in ("equal", "pfi", "optimal")}
    for result in results.values():
        assert np.all(result.power_w >= problem.lo_w - 1e-9)
        assert np.all(result.power_w <= problem.hi_w + 1e-9)
        assert result.feasible == (reduction <= result.max_w * (1 + 1e-9))
        expected = min(reduction, result.max_w)
        assert result.achieved_w == pytest.approx(expected, rel=1e-9, abs=1e-6)
        cuts = problem.gpus * (problem.hi_w - result.power_w)
        assert cuts.sum() == pytest.approx(expected, rel=1e-9, abs=1e-6)
    tol = 1e-9 * (1 + results["optimal"].value)
    assert results["optimal"].value >= results["equal"].value - tol
    assert results["optimal"].value >= results["pfi"].value - tol


# --- job mixes: bounds from the job fields -----------------------------------------------

job_doc = st.fixed_dictionaries(
    {
        "gpus": st.integers(1, 64),
        "power_w": st.floats(250.0, 690.0),
        "throughput": st.floats(100.0, 1e5),
    },
    optional={
        "pfi": st.floats(1.15, 2.6),
        "min_throughput_fraction": st.floats(0.0, 0.95),
        "protected": st.booleans(),
        "weight": st.floats(0.0, 5.0),
        "min_cap_w": st.floats(150.0, 400.0),
        "duty": st.floats(0.5, 1.0),
        "comm_power_fraction": st.floats(0.2, 1.0),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    docs=st.lists(job_doc, min_size=1, max_size=10),
    share=st.floats(0.0, 1.1),
    strategy=st.sampled_from(["equal", "pfi", "optimal"]),
)
def test_job_bounds_are_respected(docs, share, strategy):
    jobs = [{"id": f"j{i}", **d} for i, d in enumerate(docs)]
    assume(all(d.get("min_cap_w", 200.0) < d["power_w"] for d in docs))
    mix = parse_job_mix({"overhead_factor": 1.25, "jobs": jobs})
    problem = mix.problem_for()
    facility_kw = share * 1.25 * float(problem.max_cut_w.sum()) / 1000.0
    out = allocate_mix(mix, facility_kw, strategy=strategy)
    assert out["feasible"] == (facility_kw <= out["max_facility_kw"] * (1 + 1e-9))
    if out["feasible"]:
        assert out["achieved_facility_kw"] == pytest.approx(facility_kw, rel=1e-9, abs=1e-9)
    for job, row in zip(mix.jobs, out["jobs"], strict=True):
        assert job.min_cap_w - 1e-9 <= row["cap_w"] <= job.max_cap_w + 1e-9
        assert row["power_w"] <= row["cap_w"] + 1e-9
        if job.protected:
            assert row["throughput_fraction"] == pytest.approx(1.0)
            assert row["cap_w"] == pytest.approx(job.max_cap_w)
        assert row["throughput_fraction"] >= job.min_throughput_fraction - 1e-9


def test_objective_gpu_fraction_weighs_jobs_by_gpus_not_tokens():
    # a: flexible (PFI 2.2) and token-rich; b: inflexible (PFI 1.2) with cheap tokens.
    mix = parse_job_mix(
        {
            "jobs": [
                {"id": "a", "gpus": 8, "power_w": 600, "throughput": 40000, "pfi": 2.2},
                {"id": "b", "gpus": 8, "power_w": 600, "throughput": 4000, "pfi": 1.2},
            ]
        }
    )
    by_tokens = allocate_mix(mix, 1.0, objective="throughput")
    by_fraction = allocate_mix(mix, 1.0, objective="gpu_fraction")
    assert by_fraction["objective"] == "gpu_fraction"
    kept_t = [j["throughput_fraction"] for j in by_tokens["jobs"]]
    kept_f = [j["throughput_fraction"] for j in by_fraction["jobs"]]
    assert kept_t == [1.0, pytest.approx(kept_t[1])]  # summed tokens/s: b's tokens are cheaper
    assert kept_t[1] < 1.0
    assert kept_f == [pytest.approx(kept_f[0]), 1.0]  # GPU-weighted fractions: a bends easier
    assert kept_f[0] < 1.0
    assert by_fraction["achieved_gpu_kw"] == pytest.approx(1.0)


def test_allocation_json_matches_the_contract():
    mix = parse_job_mix(
        {
            "overhead_factor": 1.3,
            "jobs": [
                {"id": "a", "gpus": 16, "power_w": 640, "throughput": 42000, "pfi": 1.47},
                {"id": "b", "gpus": 8, "power_w": 600, "throughput": 20000, "pfi": 2.1},
            ],
        }
    )
    out = allocate_mix(mix, 10.0)
    assert set(out) >= {
        "strategy",
        "feasible",
        "requested_facility_kw",
        "target_gpu_kw",
        "achieved_gpu_kw",
        "achieved_facility_kw",
        "max_facility_kw",
        "throughput_before",
        "throughput_after",
        "optimality_gap_bound",
        "jobs",
    }
    assert out["target_gpu_kw"] == pytest.approx(10.0 / 1.3)
    assert out["achieved_facility_kw"] == pytest.approx(10.0)
    assert set(out["jobs"][0]) == {"id", "cap_w", "power_w", "throughput", "throughput_fraction"}


def test_an_empty_mix_can_shed_nothing():
    mix = parse_job_mix({"jobs": []})
    out = allocate_mix(mix, 1.0)
    assert out["feasible"] is False
    assert out["max_facility_kw"] == 0.0
    assert allocate_mix(mix, 0.0)["feasible"] is True


def test_many_identical_jobs_tie_without_harm():
    """Equal costs across and within jobs: any order the sort picks must reach the LP optimum."""
    job = (8, [200.0, 300.0, 400.0, 500.0, 700.0], [600.0, 800.0, 1000.0, 1200.0, 1400.0])
    jobs = [job] * 60
    for share in (0.1, 0.37, 0.5, 0.83):
        reduction = share * _max_cut(jobs)
        result = allocate(pwl_problem(jobs), reduction, "optimal")
        loss = result.value_before - result.value
        assert loss == pytest.approx(lp_min_loss(jobs, reduction), abs=_tolerance(jobs))
        assert result.achieved_w == pytest.approx(reduction, rel=1e-12)


def test_excluded_jobs_give_nothing_and_the_others_give_it_all():
    jobs = [{"id": i, "gpus": 8, "power_w": 600.0, "throughput": 2e4, "pfi": 1.5} for i in "abc"]
    mix = parse_job_mix({"overhead_factor": 1.25, "jobs": jobs})
    whole = allocate_mix(mix, 1.0)
    out = allocate_mix(mix, 1.0, excluded=[False, True, False])
    assert out["jobs"][1]["cap_w"] == pytest.approx(mix.jobs[1].max_cap_w)
    assert out["jobs"][1]["throughput_fraction"] == 1.0
    assert out["achieved_facility_kw"] == pytest.approx(1.0)
    assert out["max_facility_kw"] == pytest.approx(whole["max_facility_kw"] * 2 / 3)
    assert allocate_mix(mix, 1.0, excluded=[False] * 3) == whole


def test_a_target_too_large_for_watts_is_infeasible_not_an_error():
    mix = parse_job_mix({"jobs": [{"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 2e4}]})
    out = allocate_mix(mix, 1e308)
    assert out["feasible"] is False
    assert out["achieved_facility_kw"] == pytest.approx(out["max_facility_kw"])


@pytest.mark.parametrize("facility_kw", [-1.0, float("nan"), float("inf")])
def test_a_reduction_that_is_not_a_finite_amount_is_refused(facility_kw):
    mix = parse_job_mix({"jobs": [{"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 2e4}]})
    with pytest.raises(FlexModelError, match="must be a finite number of at least 0"):
        allocate_mix(mix, facility_kw)
