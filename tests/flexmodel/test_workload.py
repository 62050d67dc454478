import csv

import numpy as np
import pytest

from flexmodel.errors import FlexModelError
from flexmodel.workload import (
    JOB_TYPES,
    MAIN_TYPES,
    PRODUCTION_FINETUNE_SHARE,
    draw_types,
    fit_pfi_predictor,
    generate,
)


def test_embedded_job_types_match_the_studys_table(shared):
    with (shared / "data" / "h200_pfi_table.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [
        (
            r["job"],
            r["architecture"],
            r["task"],
            int(r["gpus"]),
            int(r["caps_in_grid"]),
            float(r["pfi"]),
            r["set"],
        )
        for r in rows
    ] == [(t.name, t.architecture, t.task, t.gpus, t.caps_in_grid, t.pfi, t.set) for t in JOB_TYPES]


def test_generation_is_deterministic_by_seed():
    a, b, c = generate(3, 20, seed=5), generate(3, 20, seed=5), generate(3, 20, seed=6)
    np.testing.assert_array_equal(a.true_curves.throughput, b.true_curves.throughput)
    np.testing.assert_array_equal(a.predicted_pfi, b.predicted_pfi)
    assert not np.array_equal(a.measured_pfi, c.measured_pfi)


@pytest.fixture(scope="module")
def sample():
    return generate(200, 100, mix="random", seed=3)


def test_generated_pfis_follow_the_table(sample):
    """Group medians within 0.06 of the study's (1.27, 1.43, 2.10); the range covers its own."""
    groups = np.array([MAIN_TYPES[i].group for i in sample.type_index])
    expected = {"dense": 1.27, "moe-pretrain": 1.43, "moe-finetune": 2.10}
    for group, median in expected.items():
        assert np.median(sample.measured_pfi[groups == group]) == pytest.approx(median, abs=0.06)
    assert np.quantile(sample.measured_pfi, 0.01) < 1.15
    assert np.quantile(sample.measured_pfi, 0.99) > 2.5
    assert sample.measured_pfi.min() > 0.8
    assert sample.measured_pfi.max() < 3.6


def test_true_curves_are_not_the_family_optimal_assumes(sample):
    # Same uncapped point, but the true curves differ from any fleet-default curve: their
    # shape parameters are drawn per job and their points carry noise.
    assert np.all(np.diff(sample.true_curves.throughput, axis=1) >= 0)
    np.testing.assert_allclose(sample.true_curves.uncapped_throughput, sample.throughput)
    np.testing.assert_allclose(sample.true_curves.uncapped_power_w, sample.power_w)


def test_predicted_pfi_error_is_near_the_studys_rmse(sample):
    rmse = np.sqrt(np.mean((sample.predicted_pfi - sample.measured_pfi) ** 2))
    assert 0.18 < rmse < 0.30  # the study: leave-one-out RMSE about 0.24 to 0.30


def test_production_mix_is_mostly_fine_tuning():
    rng = np.random.default_rng(0)
    index = draw_types("production", 20000, rng)
    share = np.mean([MAIN_TYPES[i].task == "finetune" for i in index])
    assert share == pytest.approx(PRODUCTION_FINETUNE_SHARE, abs=0.01)
    with pytest.raises(FlexModelError, match="unknown mix 'busy'"):
        draw_types("busy", 1, rng)


def test_ols_predictor_by_hand():
    x = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    y = 1.0 + 2.0 * x
    fit = fit_pfi_predictor(x, y, ["a", "a", "b", "b", "c", "c"])
    assert (fit.intercept, fit.slope) == (pytest.approx(1.0), pytest.approx(2.0))
    assert fit.r2 == pytest.approx(1.0)
    assert fit.loo_r2 == pytest.approx(1.0)
    assert fit.logo_r2 == pytest.approx(1.0)
    noisy = y + np.array([0.1, -0.1, 0.05, -0.05, 0.1, -0.1])
    fit = fit_pfi_predictor(x, noisy, ["a", "a", "b", "b", "c", "c"])
    # Leaving points out can only make the out-of-sample fit worse than in-sample.
    assert fit.loo_r2 < fit.r2
    assert fit.logo_r2 < fit.r2
