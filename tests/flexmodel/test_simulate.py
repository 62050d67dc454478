import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError
from flexmodel.simulate import STRATEGIES, per_job_tokens, simulate
from flexmodel.workload import generate


def test_simulation_is_deterministic_by_seed():
    a = simulate(workloads=4, jobs=20, seed=9)
    assert a == simulate(workloads=4, jobs=20, seed=9)
    assert a != simulate(workloads=4, jobs=20, seed=10)


def test_output_follows_the_contract():
    doc = simulate(workloads=3, jobs=10, reductions=[0.0, 0.3], pfi_source="measured", seed=2)
    assert {k: doc[k] for k in ("workloads", "jobs", "mix", "pfi_source", "seed")} == {
        "workloads": 3,
        "jobs": 10,
        "mix": "production",
        "pfi_source": "measured",
        "seed": 2,
    }
    first, second = doc["results"]
    assert first["reduction"] == 0.0
    assert first["gap_closed"] == {"pfi": None, "optimal": None}  # no gap at 0%
    assert set(second["tokens_per_s_per_job"]) == set(STRATEGIES)
    assert set(second["gap_closed"]) == {"pfi", "optimal"}


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mix=st.sampled_from(["production", "random"]),
    source=st.sampled_from(["measured", "predicted"]),
)
def test_oracle_is_never_beaten_on_any_workload(seed, mix, source):
    sample = generate(3, 25, mix=mix, seed=seed)
    tokens = per_job_tokens(sample, [0.1, 0.25, 0.4], source)
    oracle = tokens[:, :, STRATEGIES.index("oracle")]
    assert np.all(oracle[:, :, None] >= tokens - 1e-9 * np.abs(tokens))


@pytest.fixture(scope="module")
def production():
    return {
        source: simulate(workloads=100, jobs=100, pfi_source=source, seed=1)
        for source in ("measured", "predicted")
    }


def test_optimal_beats_pfi_and_equal_on_average(production):
    for doc in production.values():
        for row in doc["results"][1:]:
            by = row["tokens_per_s_per_job"]
            assert by["optimal"] > by["pfi"] > by["equal"]


def test_targets_at_30_percent_on_the_production_mix(production):
    def at_30(source):
        return next(r for r in production[source]["results"] if r["reduction"] == 0.3)

    assert at_30("predicted")["gap_closed"]["optimal"] >= 0.90
    assert at_30("measured")["gap_closed"]["optimal"] >= 0.97
    # The study's PFI-aware heuristic closed 63%; ours lands near it.
    assert at_30("predicted")["gap_closed"]["pfi"] == pytest.approx(0.63, abs=0.08)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pfi_source": "guessed"}, "unknown PFI source"),
        ({"reductions": [0.5, 1.0]}, "fractions in"),
        ({"reductions": []}, "fractions in"),
        ({"mix": "busy"}, "unknown mix"),
        ({"workloads": 0}, "at least 1"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(FlexModelError, match=message):
        simulate(**{"workloads": 1, "jobs": 5, **kwargs})
