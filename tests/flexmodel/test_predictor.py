import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.predictor import (
    PfiRecord,
    choose_predictor,
    dram_copy_product,
    fit_pfi_predictor,
    fit_records,
)
from flexmodel.workload import MAIN_TYPES, study_predictor


def test_the_studys_fit_has_the_studys_errors():
    fit = study_predictor()
    assert fit.source == "study"
    assert fit.samples == len(MAIN_TYPES) == 25
    assert fit.groups == 4
    # The study: leave-one-out R^2 0.524, leave-one-group-out 0.246, RMSE about 0.24 to 0.30.
    assert fit.loo_r2 == pytest.approx(0.524, abs=0.03)
    assert fit.logo_r2 == pytest.approx(0.246, abs=0.03)
    assert 0.22 <= fit.loo_rmse <= 0.26
    assert 0.28 <= fit.logo_rmse <= 0.32
    # Out of sample is worse than in sample, and across families worse than within.
    assert fit.logo_r2 < fit.loo_r2 < fit.r2


@settings(max_examples=60, deadline=None)
@given(
    intercept=st.floats(0.8, 1.5),
    slope=st.floats(0.5, 5.0),
    sigma=st.floats(0.01, 0.3),
    n=st.integers(8, 60),
    seed=st.integers(0, 2**31),
)
def test_a_known_linear_relation_is_recovered_within_the_stated_error(
    intercept, slope, sigma, n, seed
):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 0.6, n)
    y = intercept + slope * x + rng.normal(0.0, sigma, n)
    groups = [f"g{i % 3}" for i in range(n)]
    fit = fit_pfi_predictor(x, y, groups)
    inside = (x.min() + x.max()) / 2
    truth = intercept + slope * inside
    # The line at a feature inside the data is off by less than the stated error of one new
    # job there (which adds the jobs' scatter to the line's own uncertainty), by a margin.
    assert abs(float(fit.predict(inside)) - truth) <= 3.0 * float(fit.prediction_stderr(inside))
    # The stated error is about the scatter of jobs about the line.
    assert float(fit.prediction_stderr(inside)) >= 0.5 * sigma
    # Predictions stay within the fitted PFIs; no error is below the leave-one-out RMSE.
    anywhere = np.linspace(-1.0, 2.0, 31)
    assert np.all(fit.predict(anywhere) >= y.min())
    assert np.all(fit.predict(anywhere) <= y.max())
    assert np.all(fit.prediction_stderr(anywhere) >= fit.loo_rmse)


def test_the_stated_error_covers_new_jobs_as_often_as_it_says():
    rng = np.random.default_rng(7)
    sigma, n = 0.2, 40
    x = rng.uniform(0.05, 0.6, n)
    new_x = rng.uniform(0.1, 0.55, 4000)
    new_y = 1.0 + 2.0 * new_x + rng.normal(0, sigma, new_x.size)
    fit = fit_pfi_predictor(x, 1.0 + 2.0 * x + rng.normal(0, sigma, n), ["a", "b"] * (n // 2))
    fit_wide = type(fit)(**{**fit.as_dict(), "pfi_min": 0.0, "pfi_max": 10.0})
    z = np.abs(new_y - fit_wide.predict(new_x)) / fit_wide.prediction_stderr(new_x)
    # One standard error covers about 68% of new jobs; 1.645 about 90%.
    assert np.mean(z <= 1.0) == pytest.approx(0.68, abs=0.08)
    assert np.mean(z <= 1.645) == pytest.approx(0.90, abs=0.06)


def test_leaving_groups_out_reveals_a_family_the_line_does_not_describe():
    x = np.array([0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3, 0.4])
    y = np.array([1.1, 1.2, 1.3, 1.4, 2.1, 2.2, 2.3, 2.4])  # family b sits 1.0 higher
    fit = fit_pfi_predictor(x, y, ["a"] * 4 + ["b"] * 4)
    assert fit.logo_rmse == pytest.approx(1.0, abs=0.05)
    assert fit.logo_rmse > fit.loo_rmse
    assert fit.group_names == ("a", "b")
    # a job of a family the fit has not seen is as uncertain as a family left out
    assert float(fit.prediction_stderr(0.25, new_group=True)) >= fit.logo_rmse
    assert float(fit.prediction_stderr(0.25)) < fit.logo_rmse
    one_group = fit_pfi_predictor(x, y, ["a"] * 8)
    assert one_group.logo_r2 is None
    assert one_group.logo_rmse is None


def test_predictions_stay_within_the_fitted_pfis():
    fit = study_predictor()
    low, high = fit.predict(np.array([0.0, 1.0]))
    assert (low, high) == (pytest.approx(1.10), pytest.approx(2.67))


def test_the_site_fit_takes_over_once_it_has_enough_records():
    start = study_predictor()
    rng = np.random.default_rng(3)
    records = [
        PfiRecord(feature=float(f), pfi=1.0 + 3.0 * float(f), group=f"fam{i % 2}", job_id=f"j{i}")
        for i, f in enumerate(rng.uniform(0.05, 0.5, 12))
    ]
    assert choose_predictor(records[:5], start, min_samples=8) is start
    site = choose_predictor(records, start, min_samples=8)
    assert site.source == "site"
    assert site.samples == 12
    assert site.slope == pytest.approx(3.0)
    same_feature = [PfiRecord(0.2, 1.5, "a")] * 10
    assert choose_predictor(same_feature, start, min_samples=8) is start


@pytest.mark.parametrize(
    ("record", "words"),
    [
        (PfiRecord(35.0, 1.5, "dense", "j1"), "'j1': feature 35.0 is not a DRAM copy product"),
        (PfiRecord(math.nan, 1.5, "dense", "j1"), "feature nan"),
        (PfiRecord(0.2, 42.0, "dense", "j2"), "'j2': PFI 42.0 is outside"),
        (PfiRecord(0.2, 1.5, "", "j3"), "'j3': needs a group"),
    ],
)
def test_a_bad_record_is_named(record, words):
    good = [PfiRecord(0.1 * i, 1.0 + 0.1 * i, "a") for i in range(1, 5)]
    with pytest.raises(FlexModelError, match=words):
        fit_records([*good, record])


def test_a_fit_refuses_what_it_cannot_fit():
    with pytest.raises(FlexModelError, match="at least 3 samples"):
        fit_pfi_predictor([0.1, 0.2], [1.1, 1.2], ["a", "b"])
    with pytest.raises(FlexModelError, match="two different feature values"):
        fit_pfi_predictor([0.2] * 4, [1.1, 1.2, 1.3, 1.4], ["a"] * 4)
    with pytest.raises(FlexModelError, match="as many features"):
        fit_pfi_predictor([0.1, 0.2, 0.3], [1.1, 1.2], ["a"] * 3)


def test_the_feature_model_rises_with_pfi_and_stays_a_fraction():
    rng = np.random.default_rng(0)
    pfi = np.linspace(1.0, 3.0, 2000)
    feature = dram_copy_product(pfi, rng)
    assert np.all((feature > 0) & (feature <= 1))
    assert np.corrcoef(pfi, feature)[0, 1] > 0.8


@pytest.mark.parametrize("family", ["", "  ", 7, "x" * 65])
def test_a_jobs_model_family_must_be_a_short_name(family):
    doc = {"jobs": [{"id": "j", "gpus": 8, "power_w": 600, "throughput": 1e4}]}
    doc["jobs"][0]["model_family"] = family
    with pytest.raises(FlexModelError, match="job 'j': 'model_family' must be a name"):
        parse_job_mix(doc)
    doc["jobs"][0]["model_family"] = " moe-finetune "
    assert parse_job_mix(doc).jobs[0].model_family == "moe-finetune"
