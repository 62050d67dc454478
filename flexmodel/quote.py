"""Flexibility quotes (MODEL.md section 6): how many kW the site can shed, at what cost.

A quote covers a window. Jobs whose `remaining_s` is shorter than the window do not count
toward what it can hold (they may be gone before it ends), nor do the jobs the caller leaves
out (`left_out`: a job with no placement, or on a node that does not answer, cannot be
capped); they give nothing here, and each says why.

- `supply_curve`: facility kW shed -> tokens/s lost, from 0 to `achievable_kw`, at the cuts
  `optimal` makes for each level (repaired on non-concave curves), so a point of the curve
  costs exactly what `allocate` costs at that kW, overall and per job;
- `achievable_kw`: the most the eligible jobs can shed within every bound, at the meter;
- `firm_kw`: what can be shed with probability `confidence` given the PFI standard errors
  (`pfi_stderr`) and the overhead factor's (`overhead_factor_stderr`). An analytic bound, not
  a Monte Carlo: the shed is `F = k * sum_j S_j(PFI_j)`, and to first order
  `Var F = (S * se_k)^2 + k^2 * sum_j (dS_j/dPFI * se_j)^2`, the derivative from one rebuild
  of the curves at a lower PFI (`JobMix.shed_per_pfi_w`): a lower PFI lowers what a job can
  give, as its QoS floor and its power at the minimum cap both rise.
  `firm_kw = k*S - z_C * sd(F)`, clipped to `[0, achievable_kw]`. Declared sweeps carry no
  PFI uncertainty; a sweep fitted on site with its standard error (`pfi_stderr`) does, its
  cut proportional to its PFI (`JobMix.shed_per_pfi_w`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from flexmodel.allocate import allocate, optimal_cuts
from flexmodel.curves import throughput_at_power
from flexmodel.errors import FlexModelError
from flexmodel.jobs import JobMix
from flexmodel.problem import AllocationProblem

DEFAULT_WINDOW_S = 3600.0
DEFAULT_CONFIDENCE = 0.9
CURVE_POINTS = 21


def quote(
    mix: JobMix,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    confidence: float = DEFAULT_CONFIDENCE,
    reduction_kw: float | None = None,
    points: int = CURVE_POINTS,
    per_job_curves: bool = True,
    left_out: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A quote in the JSON shape of `flexgate quote --json` and `POST /v1/quotes`.

    Without `per_job_curves` each job lists its largest cut but not its own supply curve (for a
    10k-job site those curves are 210k entries, most of the quote's time and size).
    `left_out` names jobs that give nothing, by id, with the reason.
    """
    _check(window_s, confidence, reduction_kw, points)
    k = mix.overhead_factor
    reasons = {**(left_out or {})}
    for job in mix.jobs:
        if job.id not in reasons and job.remaining_s is not None and job.remaining_s < window_s:
            reasons[job.id] = (
                f"ends in {job.remaining_s:g} s, before the {window_s:g} s window does"
            )
    counted = np.array([j.id not in reasons for j in mix.jobs], dtype=bool)
    problem = mix.problem.excluding(~counted)
    max_cut = problem.max_cut_w
    shed_w = float(max_cut.sum())
    levels = np.linspace(0.0, shed_w, points)
    cuts = optimal_cuts(problem, levels)  # (P, J)
    before = problem.curves.uncapped_throughput
    lost = np.stack(
        [
            before
            - throughput_at_power(
                problem.curves, np.clip(problem.hi_w - c / problem.gpus, problem.lo_w, problem.hi_w)
            )
            for c in cuts
        ]
    )
    total = lost.sum(axis=1)
    achievable_kw = k * shed_w / 1000.0
    firm_kw = _firm_kw(mix, counted, shed_w, confidence)
    curve_kw = k * levels / 1000.0
    doc: dict[str, Any] = {
        "window_s": window_s,
        "overhead_factor": k,
        "confidence": confidence,
        "achievable_kw": achievable_kw,
        "firm_kw": firm_kw,
        "achievable_throughput_loss": float(total[-1]),
        "firm_throughput_loss": float(np.interp(firm_kw, curve_kw, total)),
        "jobs_counted": int(counted.sum()),
        "supply_curve": [
            {"facility_kw": kw, "throughput_loss": loss, "throughput_loss_fraction": share}
            for kw, loss, share in zip(
                curve_kw.tolist(),
                total.tolist(),
                (total / max(before.sum(), 1e-300)).tolist(),
                strict=True,
            )
        ],
    }
    if reduction_kw is not None:
        doc |= _requested(problem, reduction_kw, reduction_kw * 1000.0 / k, shed_w)
    job_kw, job_loss = (k * cuts / 1000.0).T.tolist(), lost.T.tolist()
    doc["jobs"] = [
        {
            "id": job.id,
            "counted": bool(counted[j]),
            "max_reduction_w": float(max_cut[j]),
            **({} if counted[j] else {"reason": reasons[job.id]}),
        }
        for j, job in enumerate(mix.jobs)
    ]
    doc["left_out"] = [{"id": job_id, "reason": why} for job_id, why in reasons.items()]
    if per_job_curves:
        for j, row in enumerate(doc["jobs"]):
            row["supply_curve"] = [
                {"facility_kw": kw, "throughput_loss": loss}
                for kw, loss in zip(job_kw[j], job_loss[j], strict=True)
            ]
    return doc


def _requested(
    problem: AllocationProblem, reduction_kw: float, asked_w: float, shed_w: float
) -> dict[str, Any]:
    """Feasibility and cost of a requested reduction (`asked_w` of GPU power), from `optimal`."""
    answer = allocate(problem, min(asked_w, shed_w), "optimal")
    return {
        "requested_kw": reduction_kw,
        "requested_feasible": bool(asked_w <= shed_w * (1 + 1e-9)),
        "requested_throughput_loss": float(
            answer.throughput_before.sum() - answer.throughput.sum()
        ),
    }


def _firm_kw(mix: JobMix, counted: np.ndarray, shed_w: float, confidence: float) -> float:
    k, se_k = mix.overhead_factor, mix.overhead_factor_stderr
    se = np.where(counted, [j.pfi_error for j in mix.jobs], 0.0)
    var_jobs = float(np.sum((mix.shed_per_pfi_w * se) ** 2)) if np.any(se > 0) else 0.0
    sd = math.sqrt((shed_w * se_k) ** 2 + k**2 * var_jobs)
    z = NormalDist().inv_cdf(confidence)
    return float(min(max(k * shed_w - z * sd, 0.0), k * shed_w) / 1000.0)


def _check(window_s: float, confidence: float, reduction_kw: float | None, points: int) -> None:
    if not (math.isfinite(window_s) and window_s > 0):
        raise FlexModelError(f"window {window_s!r} s must be a positive number")
    if not (math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise FlexModelError(f"confidence {confidence!r} must lie strictly between 0 and 1")
    if reduction_kw is not None and not (math.isfinite(reduction_kw) and reduction_kw >= 0):
        raise FlexModelError(f"reduction {reduction_kw!r} kW must be a finite number of at least 0")
    if points < 2:
        raise FlexModelError("a supply curve needs at least two points")
