import copy

import numpy as np
import pytest

from flexmodel.errors import InvalidJobError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import DEFAULT_DUTY
from flexmodel.pfi import COARSE_GRID_W, DEFAULT_PFI, DEFAULT_PFI_STDERR, FINE_GRID_W

BASE = {
    "overhead_factor": 1.3,
    "jobs": [
        {"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 20000.0, "pfi": 1.5},
        {"id": "b", "gpus": 16, "power_w": 640.0, "throughput": 42000.0},
    ],
}


def with_job(**changes):
    doc = copy.deepcopy(BASE)
    doc["jobs"][0].update(changes)
    for key, value in changes.items():
        if value is _DROP:
            del doc["jobs"][0][key]
    return doc


_DROP = object()


def test_defaults_are_documented_values():
    mix = parse_job_mix(BASE)
    a, b = mix.jobs
    assert (mix.overhead_factor, mix.overhead_factor_stderr, mix.static_load_kw) == (1.3, 0.0, 0.0)
    assert a.curve_source == "pfi"
    assert b.curve_source == "default"
    assert (b.pfi_value, b.pfi_error) == (DEFAULT_PFI, DEFAULT_PFI_STDERR)
    assert a.grid_w == FINE_GRID_W
    assert b.grid_w == COARSE_GRID_W
    assert (a.min_cap_w, a.max_cap_w, a.duty, a.weight) == (200.0, 700.0, DEFAULT_DUTY, 1.0)


def test_the_contract_example_parses():
    job = {
        "id": "qwen3-32b-pt",
        "gpus": 16,
        "power_w": 640.0,
        "throughput": 42000.0,
        "pfi": 1.47,
        "pfi_stderr": 0.0,
        "pfi_grid_w": [200, 500, 600, 700],
        "sweep": [{"cap_w": 200, "power_w": 198.0, "throughput": 21000.0}],
        "min_cap_w": 200.0,
        "max_cap_w": 700.0,
        "min_throughput_fraction": 0.5,
        "protected": False,
        "weight": 1.0,
        "remaining_s": 7200,
        "period_s": 2.4,
        "duty": 0.7,
        "comm_power_fraction": 0.45,
        "placement": [
            {"node": "node-01", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
            {"node": "node-02", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
        ],
    }
    doc = {
        "overhead_factor": 1.3,
        "overhead_factor_stderr": 0.05,
        "static_load_kw": 120.0,
        "jobs": [job],
    }
    mix = parse_job_mix(doc)
    (parsed,) = mix.jobs
    assert parsed.curve_source == "sweep"
    # The sweep lacks the uncapped run: the job's own point completes it at max_cap_w.
    assert parsed.full_sweep[-1] == (700.0, 640.0, 42000.0)
    np.testing.assert_allclose(mix.curves.uncapped_power_w, [640.0])


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "expected a JSON object"),
        ({"jobs": {}}, "'jobs' must be a list"),
        ({"jobs": [], "colour": "red"}, "unknown field.*'colour'"),
        (with_job(speed=3), "job 'a': unknown field.*'speed'"),
        (with_job(gpus=0), "'gpus' must be a whole number"),
        (with_job(gpus=2.5), "'gpus' must be a whole number"),
        (with_job(gpus=True), "'gpus' must be a whole number"),
        (with_job(power_w=-5.0), "'power_w' must be from 50 to 2000 W, got -5"),
        (with_job(power_w=float("nan")), "'power_w' must be a finite number"),
        (with_job(power_w="600"), "'power_w' must be a finite number"),
        (with_job(power_w=750.0), "power_w 750 is above max_cap_w 700"),
        (with_job(throughput=_DROP), "missing required field 'throughput'"),
        (with_job(id=""), r"jobs\[0\]: 'id' must be a non-empty string"),
        (with_job(min_cap_w=700.0), "min_cap_w 700 must be below max_cap_w 700"),
        (
            with_job(min_throughput_fraction=1.5),
            "'min_throughput_fraction' must be from 0 to 1, got 1.5",
        ),
        (with_job(duty=0.0), "'duty' must be above 0 and at most 1"),
        (with_job(protected="yes"), "'protected' must be true or false"),
        (with_job(pfi=0.5), "pfi 0.5 is outside what the fleet family can represent"),
        (with_job(pfi_grid_w=[700]), "pfi_grid_w needs two or more"),
        (with_job(sweep=[{"cap_w": 200, "power_w": 190}]), r"sweep\[0\]: missing required field"),
        (with_job(sweep=[{"cap_w": 800, "power_w": 600, "throughput": 1}]), "above max_cap_w"),
        (
            with_job(sweep=[{"cap_w": 700, "power_w": 500, "throughput": 20000}]),
            "uncapped point has power_w 500, but the job states 600",
        ),
        (
            with_job(sweep=[{"cap_w": 300, "power_w": 290, "throughput": 25000}]),
            "throughput falls",
        ),
        (
            with_job(placement=[{"node": "n1", "gpus": [0, 1, 2]}]),
            "placement covers 3 GPUs but the job has 8",
        ),
        (
            with_job(placement=[{"node": "n1", "gpus": [0, 0, 1, 2, 3, 4, 5, 6]}]),
            "a GPU index appears twice",
        ),
    ],
)
def test_bad_job_mixes_are_refused_naming_the_problem(doc, message):
    with pytest.raises(InvalidJobError, match=message):
        parse_job_mix(doc)


def test_duplicate_ids_are_refused():
    doc = copy.deepcopy(BASE)
    doc["jobs"][1]["id"] = "a"
    with pytest.raises(InvalidJobError, match="job id 'a' appears twice"):
        parse_job_mix(doc)


def test_overhead_factor_below_one_is_refused():
    with pytest.raises(InvalidJobError, match=r"'overhead_factor' must be from 1 to 3, got 0\.8"):
        parse_job_mix({**BASE, "overhead_factor": 0.8})


def test_a_sweep_job_is_ranked_by_its_own_pfi():
    sweep = [
        {"cap_w": 300, "power_w": 300.0, "throughput": 12000.0},
        {"cap_w": 500, "power_w": 480.0, "throughput": 18000.0},
    ]
    mix = parse_job_mix(with_job(pfi=_DROP, sweep=sweep))
    expected = np.mean(
        [(1 - 300 / 600) / (1 - 12000 / 20000), (1 - 480 / 600) / (1 - 18000 / 20000)]
    )
    assert mix.jobs[0].pfi_value == pytest.approx(expected)


def _placed(gpus: int) -> list[dict]:
    return [{"node": "n1", "gpus": list(range(gpus))}]


def test_site_power_counts_placed_jobs_only():
    doc = copy.deepcopy(BASE)
    doc["jobs"][0]["placement"] = _placed(8)
    doc["jobs"][0]["max_cap_w"] = 650.0
    mix = parse_job_mix(doc)
    assert mix.placed == (mix.jobs[0],)
    assert mix.baseline_gpu_kw == pytest.approx(8 * 600.0 / 1000.0)  # not job b's 16 x 640 W
    assert mix.max_gpu_kw == pytest.approx(8 * 650.0 / 1000.0)


def test_no_placed_job_is_no_site_power():
    mix = parse_job_mix(BASE)
    assert (mix.baseline_gpu_kw, mix.max_gpu_kw) == (0.0, 0.0)


def test_only_two_level_waveforms_wave():
    mix = parse_job_mix(with_job(duty=1.0))  # job b keeps the default duty
    assert [j.id for j in mix.waving] == ["b"]
    assert [j.id for j in parse_job_mix(with_job(duty=0.5)).waving] == ["a", "b"]
