"""Flexibility quotes (MODEL.md section 6): how many kW the site can shed, at what cost.

A quote covers a window. Jobs whose `remaining_s` is shorter than the window do not count
toward what it can hold (they may be gone before it ends), so they give nothing here.

- `supply_curve`: facility kW shed -> tokens/s lost, from 0 to `achievable_kw`, on `optimal`'s
  cuts (on the hulls of non-concave curves, valued on the real curves), overall and per job;
- `achievable_kw`: the most the eligible jobs can shed within every bound, at the meter;
- `firm_kw`: what can be shed with probability `confidence` given the PFI standard errors
  (`pfi_stderr`) and the overhead factor's (`overhead_factor_stderr`). An analytic bound, not
  a Monte Carlo: the shed is `F = k * sum_j S_j(PFI_j)`, and to first order
  `Var F = (S * se_k)^2 + k^2 * sum_j (dS_j/dPFI * se_j)^2`, with the derivative from one
  rebuild of the curves at `PFI - PFI_STEP` (a lower PFI lowers what a job can give: its QoS
  floor and its power at the minimum cap both rise). `firm_kw = k*S - z_C * sd(F)`, clipped to
  `[0, achievable_kw]`. Sweep jobs carry no PFI uncertainty (their curve is measured).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from flexmodel.allocate import allocate, hull_cuts, mix_problem
from flexmodel.curves import throughput_at_power
from flexmodel.errors import FlexModelError
from flexmodel.jobs import JobMix, job_curves

DEFAULT_WINDOW_S = 3600.0
DEFAULT_CONFIDENCE = 0.9
CURVE_POINTS = 21
#: Finite-difference step for the sensitivity of a job's shed to its PFI.
PFI_STEP = 0.05


def quote(
    mix: JobMix,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    confidence: float = DEFAULT_CONFIDENCE,
    reduction_kw: float | None = None,
    points: int = CURVE_POINTS,
) -> dict[str, Any]:
    """A quote in the JSON shape of CONTRACT.md (`flexgate quote --json`, `POST /v1/quotes`)."""
    _check(window_s, confidence, reduction_kw, points)
    k = mix.overhead_factor
    gone = np.array([j.remaining_s is not None and j.remaining_s < window_s for j in mix.jobs])
    problem = mix_problem(mix, unavailable=gone)
    max_cut = problem.max_cut_w
    shed_w = float(max_cut.sum())
    levels = np.linspace(0.0, shed_w, points)
    cuts = hull_cuts(problem, levels)  # (P, J)
    before = problem.curves.uncapped_throughput
    lost = np.stack(
        [
            before - throughput_at_power(problem.curves, problem.hi_w - c / problem.gpus)
            for c in cuts
        ]
    )
    total = lost.sum(axis=1)
    achievable_kw = k * shed_w / 1000.0
    firm_kw = _firm_kw(mix, gone, max_cut, confidence)
    curve_kw = k * levels / 1000.0
    doc: dict[str, Any] = {
        "window_s": window_s,
        "overhead_factor": k,
        "confidence": confidence,
        "achievable_kw": achievable_kw,
        "firm_kw": firm_kw,
        "achievable_throughput_loss": float(total[-1]),
        "firm_throughput_loss": float(np.interp(firm_kw, curve_kw, total)),
        "jobs_counted": int((~gone).sum()),
        "supply_curve": [
            {
                "facility_kw": float(kw),
                "throughput_loss": float(loss),
                "throughput_loss_fraction": float(loss / before.sum()) if before.sum() else 0.0,
            }
            for kw, loss in zip(curve_kw, total, strict=True)
        ],
    }
    if reduction_kw is not None:
        asked_w = reduction_kw * 1000.0 / k
        answer = allocate(problem, min(asked_w, shed_w), "optimal")
        doc |= {
            "requested_kw": reduction_kw,
            "requested_feasible": bool(asked_w <= shed_w * (1 + 1e-9)),
            "requested_throughput_loss": float(before.sum() - answer.throughput.sum()),
        }
    doc["jobs"] = [
        {
            "id": job.id,
            "counted": not bool(gone[j]),
            "max_reduction_w": float(max_cut[j]),
            "supply_curve": [
                {
                    "facility_kw": float(k * cuts[p, j] / 1000.0),
                    "throughput_loss": float(lost[p, j]),
                }
                for p in range(points)
            ],
        }
        for j, job in enumerate(mix.jobs)
    ]
    return doc


def _firm_kw(mix: JobMix, gone: np.ndarray, max_cut: np.ndarray, confidence: float) -> float:
    k, se_k = mix.overhead_factor, mix.overhead_factor_stderr
    shed = float(max_cut.sum())
    se = np.array([0.0 if j.curve_source == "sweep" else j.pfi_error for j in mix.jobs])
    se[gone] = 0.0
    var_jobs = 0.0
    if np.any(se > 0):
        pfi = np.array([j.pfi_value for j in mix.jobs])
        lower = mix_problem(mix, curves=job_curves(mix.jobs, pfi=pfi - PFI_STEP), unavailable=gone)
        slope = (max_cut - lower.max_cut_w) / PFI_STEP  # W of shed per unit of PFI
        var_jobs = float(np.sum((slope * se) ** 2))
    sd = math.sqrt((shed * se_k) ** 2 + k**2 * var_jobs)
    z = NormalDist().inv_cdf(confidence)
    return float(min(max(k * shed - z * sd, 0.0), k * shed) / 1000.0)


def _check(window_s: float, confidence: float, reduction_kw: float | None, points: int) -> None:
    if not (math.isfinite(window_s) and window_s > 0):
        raise FlexModelError(f"window {window_s!r} s must be a positive number")
    if not (math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise FlexModelError(f"confidence {confidence!r} must lie strictly between 0 and 1")
    if reduction_kw is not None and not (math.isfinite(reduction_kw) and reduction_kw >= 0):
        raise FlexModelError(f"reduction {reduction_kw!r} kW must be a finite number of at least 0")
    if points < 2:
        raise FlexModelError("a supply curve needs at least two points")
