"""A job's PFI predicted from its telemetry (docs/model.md, section 10).

The PFI study's best single feature is the DRAM copy product: DRAM activity
(`DCGM_FI_PROF_DRAM_ACTIVE`, a fraction) times memory copy utilisation (NVML's memory
utilisation, `DCGM_FI_DEV_MEM_COPY_UTIL`, as a fraction), both from the uncapped run. The
predictor is ordinary least squares of PFI on that one feature, fitted on records
`(feature, measured PFI, group)`: first the study's (`flexmodel.workload.study_predictor`),
then the site's own measured jobs once there are enough (`choose_predictor`).

Every fit reports its in-sample R^2 and its out-of-sample errors: leave-one-out (a new job of
a kind the fit has seen) and leave-one-group-out (a new family; groups are model families such
as dense, MoE pretraining, MoE fine-tuning). A prediction carries its standard error: the OLS
prediction error of a new observation at that feature, never below the leave-one-out RMSE
(the fit's own residuals understate what it misses out of sample), and for a job of a group
the fit has not seen never below the leave-one-group-out RMSE. Predictions are kept inside
the range of PFIs the fit was made on: a line is not evidence beyond its data.

`dram_copy_product` is the feature model of simulated jobs (the workload generator's and the
simulated agents'): the feature a job of a given PFI shows, with the scatter that gives the
study's leave-one-out R^2 near 0.52.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flexmodel.errors import FlexModelError

Array = NDArray[np.float64]

#: DRAM copy product = DRAM_BASE + DRAM_SLOPE * (PFI - 1) + noise (sigma DRAM_NOISE): the
#: simulated jobs' feature. The noise is set so the OLS fit on the study's 25 main job types
#: gives a leave-one-out R^2 near the study's 0.524.
DRAM_BASE, DRAM_SLOPE, DRAM_NOISE = 0.10, 0.30, 0.075
#: A fit needs at least this many records (two parameters, and one left out).
MIN_FIT_SAMPLES = 3
#: What a record's PFI may be: the job-mix range (`flexmodel.jobmix.PFI_RANGE`).
RECORD_PFI_RANGE = (0.5, 10.0)


@dataclass(frozen=True)
class PfiRecord:
    """One measured job: its DRAM copy product (uncapped), its measured PFI, its group."""

    feature: float  #: DRAM copy product, in [0, 1]
    pfi: float  #: measured (Eq. 1 on a sweep)
    group: str  #: model family, for the leave-one-group-out error
    job_id: str = ""


@dataclass(frozen=True)
class PfiPredictor:
    """PFI = intercept + slope * DRAM copy product, with the errors of its fit."""

    intercept: float
    slope: float
    samples: int
    r2: float
    loo_r2: float  #: leave-one-out
    logo_r2: float | None  #: leave-one-group-out; None with fewer than two groups
    loo_rmse: float
    logo_rmse: float | None = None
    residual_se: float = 0.0  #: the fit's residual standard error (n - 2 degrees of freedom)
    feature_mean: float = 0.0
    feature_ss: float = 0.0  #: sum of squared deviations of the features
    pfi_min: float = RECORD_PFI_RANGE[0]  #: predictions are kept in the fitted PFIs' range
    pfi_max: float = RECORD_PFI_RANGE[1]
    groups: int = 0
    source: str = "fit"  #: `study` or `site`: what it was fitted on
    group_names: tuple[str, ...] = ()  #: the groups it was fitted on

    def predict(self, feature: Array | float) -> Array:
        """The predicted PFI at each feature, within the fitted PFIs' range."""
        raw = self.intercept + self.slope * np.asarray(feature, dtype=float)
        return np.asarray(np.clip(raw, self.pfi_min, self.pfi_max), dtype=float)

    def prediction_stderr(self, feature: Array | float, *, new_group: bool = False) -> Array:
        """Standard error of a new job's PFI at each feature: the OLS prediction error (the
        scatter of jobs about the line plus the line's own uncertainty there), at least the
        leave-one-out RMSE; for a job of a group the fit has not seen (`new_group`), at least
        the leave-one-group-out RMSE."""
        x = np.asarray(feature, dtype=float)
        leverage = 1.0 / self.samples + (
            (x - self.feature_mean) ** 2 / self.feature_ss if self.feature_ss > 0 else 0.0
        )
        ols = self.residual_se * np.sqrt(1.0 + leverage)
        floor = self.loo_rmse
        if new_group:
            floor = max(floor, self.logo_rmse if self.logo_rmse is not None else self.loo_rmse)
        return np.asarray(np.maximum(ols, floor), dtype=float)

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def dram_copy_product(
    pfi: Array | float, rng: np.random.Generator, noise: float = DRAM_NOISE
) -> Array:
    """Telemetry feature of a simulated job: DRAM activity times memory copy utilisation,
    in [0, 1], from its PFI with the feature model's scatter (sigma `noise`)."""
    scatter = rng.normal(0.0, noise, np.shape(pfi))
    return np.asarray(
        np.clip(DRAM_BASE + DRAM_SLOPE * (np.asarray(pfi) - 1.0) + scatter, 0.005, 1.0),
        dtype=float,
    )


def fit_pfi_predictor(
    feature: Array | Sequence[float],
    pfi: Array | Sequence[float],
    groups: Sequence[str],
    *,
    source: str = "fit",
) -> PfiPredictor:
    """OLS of PFI on one feature, with leave-one-out and leave-one-group-out errors."""
    x, y = np.asarray(feature, dtype=float), np.asarray(pfi, dtype=float)
    labels = np.asarray(list(groups), dtype=object)
    if not x.size == y.size == labels.size:
        raise FlexModelError(
            f"a PFI fit needs as many features, PFIs and groups ({x.size}, {y.size}, "
            f"{labels.size} given)"
        )
    if x.size < MIN_FIT_SAMPLES:
        raise FlexModelError(f"a PFI predictor needs at least {MIN_FIT_SAMPLES} samples")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise FlexModelError("a PFI fit's features and PFIs must be finite numbers")
    if np.ptp(x) <= 0.0:
        raise FlexModelError("a PFI fit needs at least two different feature values")
    everyone = np.ones(x.size, dtype=bool)
    intercept, slope = _ols(x, y, everyone)
    loo = np.empty_like(y)
    for i in range(x.size):
        a, b = _ols(x, y, everyone & (np.arange(x.size) != i))
        loo[i] = a + b * x[i]
    distinct = sorted(set(labels.tolist()))
    logo: Array | None = None
    if len(distinct) >= 2:
        logo = np.empty_like(y)
        for g in distinct:
            a, b = _ols(x, y, labels != g)
            logo[labels == g] = a + b * x[labels == g]
    fitted = intercept + slope * x
    dof = max(x.size - 2, 1)
    return PfiPredictor(
        intercept=intercept,
        slope=slope,
        samples=int(x.size),
        r2=_r2(y, fitted),
        loo_r2=_r2(y, loo),
        logo_r2=None if logo is None else _r2(y, logo),
        loo_rmse=_rmse(y, loo),
        logo_rmse=None if logo is None else _rmse(y, logo),
        residual_se=math.sqrt(float(np.sum((y - fitted) ** 2)) / dof),
        feature_mean=float(x.mean()),
        feature_ss=float(np.sum((x - x.mean()) ** 2)),
        pfi_min=float(y.min()),
        pfi_max=float(y.max()),
        groups=len(distinct),
        source=source,
        group_names=tuple(distinct),
    )


def fit_records(records: Sequence[PfiRecord], *, source: str = "site") -> PfiPredictor:
    """The OLS fit on these records (each checked first; the first bad one is named)."""
    for r in records:
        check_record(r)
    return fit_pfi_predictor(
        [r.feature for r in records],
        [r.pfi for r in records],
        [r.group for r in records],
        source=source,
    )


def check_record(record: PfiRecord) -> None:
    """`FlexModelError` naming what is wrong with a record."""
    name = f"PFI record '{record.job_id}'" if record.job_id else "a PFI record"
    if not (math.isfinite(record.feature) and 0.0 <= record.feature <= 1.0):
        raise FlexModelError(
            f"{name}: feature {record.feature!r} is not a DRAM copy product in [0, 1] "
            "(both factors are fractions, not percentages)"
        )
    low, high = RECORD_PFI_RANGE
    if not (math.isfinite(record.pfi) and low <= record.pfi <= high):
        raise FlexModelError(f"{name}: PFI {record.pfi!r} is outside [{low:g}, {high:g}]")
    if not record.group:
        raise FlexModelError(f"{name}: needs a group (its model family)")


def choose_predictor(
    records: Sequence[PfiRecord], start: PfiPredictor, *, min_samples: int
) -> PfiPredictor:
    """The site's own fit once it has `min_samples` records with two different features,
    else `start` (the study's fit)."""
    if len(records) < max(min_samples, MIN_FIT_SAMPLES):
        return start
    if len({r.feature for r in records}) < 2:
        return start
    return fit_records(records)


def _ols(x: Array, y: Array, mask: NDArray[np.bool_]) -> tuple[float, float]:
    """(intercept, slope) on the masked points; a flat line where their features are equal."""
    xm, ym = x[mask], y[mask]
    sxx = float(np.sum((xm - xm.mean()) ** 2))
    if sxx <= 0.0:
        return float(ym.mean()), 0.0
    slope = float(np.sum((xm - xm.mean()) * (ym - ym.mean()))) / sxx
    return float(ym.mean() - slope * xm.mean()), slope


def _r2(y: Array, predicted: Array) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    if total <= 0.0:
        return 0.0
    return 1.0 - float(np.sum((y - predicted) ** 2)) / total


def _rmse(y: Array, predicted: Array) -> float:
    return float(np.sqrt(np.mean((y - predicted) ** 2)))
