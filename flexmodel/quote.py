"""Flexibility quotes (docs/model.md, section 7): how many kW the site can shed, at what cost.

A quote covers a window. Jobs whose `remaining_s` is shorter than the window do not count
toward what it can hold (they may be gone before it ends), nor do the jobs the caller leaves
out (`left_out`: a job with no placement, or on a node that does not answer, cannot be
capped); they give nothing here, and each says why.

- `supply_curve`: facility kW shed -> tokens/s lost, from 0 to `achievable_kw`, at the cuts
  `optimal` makes for each level (repaired on non-concave curves), so a point of the curve
  costs exactly what `allocate` costs at that kW, overall and per job;
- `achievable_kw`: the most the eligible jobs can shed within every bound, at the meter;
- `firm_kw`: what can be shed with probability `confidence`. An analytic bound, not a Monte
  Carlo (docs/model.md, "Firm kW"): the shed is `F = k * sum_j S_j`, and to first order

      Var F = (S * se_k)^2 + k^2 * sum_j (dS_j/dPFI * se_j)^2 + k^2 * (sum_j sd_j)^2

  The first term is the overhead factor's error (`overhead_factor_stderr`). The second, the
  PFIs' (`pfi_stderr`), independent from job to job: the derivative from one rebuild of the
  curves at a lower PFI (`JobMix.shed_per_pfi_w`), as a lower PFI raises a job's QoS floor and
  its power at the minimum cap. The third, the jobs' uncapped power: a plan fixes caps, so a
  job drawing a fraction `e` less than believed sheds `e * n_j * P_j` less (its capped draw is
  held by the cap), at most its whole cut: `sd_j = min(u_j * n_j * P_j, S_j)`, `u_j` its
  measured relative error (`power_stderr_w / power_w`) or, declared, `power_uncertainty`.
  That error is common-mode (one benchmark, one software stack, one cooling loop: every GPU
  off the same way), so the jobs' sd add linearly, as one shared variable's, not as
  independent variances; it is independent of the PFIs' and `k`'s, so its variance adds to
  theirs. `firm_kw = h * clip(k*S - z_C * sd(F), 0, k*S)`, where `h` (`history`, at most 1)
  is the site's own record at the meter: the `1 - confidence` quantile of delivered over
  requested in its last events, so a site that delivered less than planned quotes less.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
#: Relative standard error of a declared `power_w` (FLEXGATE_DECLARED_POWER_UNCERTAINTY): the
#: simulated sites draw up to +-15% from it, and a figure from one benchmark run on another
#: stack is rarely closer (docs/model.md, "Firm kW").
DEFAULT_POWER_UNCERTAINTY = 0.15


@dataclass(frozen=True)
class Delivered:
    """One past event at the meter: the reduction asked for and the one seen, averaged over
    the time the meter was read [kW]."""

    event_id: str
    requested_kw: float
    delivered_kw: float


def quote(
    mix: JobMix,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    confidence: float = DEFAULT_CONFIDENCE,
    reduction_kw: float | None = None,
    points: int = CURVE_POINTS,
    per_job_curves: bool = True,
    left_out: Mapping[str, str] | None = None,
    power_uncertainty: float = DEFAULT_POWER_UNCERTAINTY,
    history: Sequence[Delivered] = (),
) -> dict[str, Any]:
    """A quote in the JSON shape of `flexgate quote --json` and `POST /v1/quotes`.

    Without `per_job_curves` each job lists its largest cut but not its own supply curve (for a
    10k-job site those curves are 210k entries, most of the quote's time and size).
    `left_out` names jobs that give nothing, by id, with the reason. `power_uncertainty` is
    the relative standard error of a declared `power_w`; `history`, the site's last events
    at the meter (newest first), scales firm kW by `history_factor`.
    """
    _check(window_s, confidence, reduction_kw, points, power_uncertainty)
    k = mix.overhead_factor
    reasons = _reasons_left_out(mix, left_out, window_s)
    counted = np.array([j.id not in reasons for j in mix.jobs], dtype=bool)
    problem = mix.problem.excluding(~counted)
    max_cut = problem.max_cut_w
    shed_w = float(max_cut.sum())
    levels = np.linspace(0.0, shed_w, points)
    cuts = optimal_cuts(problem, levels)  # (P, J)
    lost = _throughput_lost(problem, cuts)
    total = lost.sum(axis=1)
    spread = _spread_w(mix, counted, max_cut, power_uncertainty)
    factor, used = history_factor(history, confidence)
    firm_kw = factor * _firm_kw(mix, shed_w, confidence, spread)
    curve_kw = k * levels / 1000.0
    doc: dict[str, Any] = {
        "window_s": window_s,
        "overhead_factor": k,
        "confidence": confidence,
        "achievable_kw": k * shed_w / 1000.0,
        "firm_kw": firm_kw,
        "power_uncertainty": power_uncertainty,
        "uncertainty_kw": {name: k * sd_w / 1000.0 for name, sd_w in spread.sd_w().items()},
        "history": _history_doc(used, confidence, factor),
        "achievable_throughput_loss": float(total[-1]),
        "firm_throughput_loss": float(np.interp(firm_kw, curve_kw, total)),
        "jobs_counted": int(counted.sum()),
        "supply_curve": _supply_curve(curve_kw, total, problem.curves.uncapped_throughput),
    }
    if reduction_kw is not None:
        doc |= _requested(problem, reduction_kw, reduction_kw * 1000.0 / k, shed_w)
    doc["jobs"] = _jobs_doc(mix, reasons, max_cut, spread.power_w)
    doc["left_out"] = [{"id": job_id, "reason": why} for job_id, why in reasons.items()]
    if per_job_curves:
        for row, curve in zip(doc["jobs"], _job_curves(k * cuts / 1000.0, lost), strict=True):
            row["supply_curve"] = curve
    return doc


def _reasons_left_out(
    mix: JobMix, left_out: Mapping[str, str] | None, window_s: float
) -> dict[str, str]:
    """Why each job that gives nothing does, by id: the caller's `left_out`, then the jobs
    that end inside the window."""
    reasons = {**(left_out or {})}
    for job in mix.jobs:
        if job.id not in reasons and job.remaining_s is not None and job.remaining_s < window_s:
            reasons[job.id] = (
                f"ends in {job.remaining_s:g} s, before the {window_s:g} s window does"
            )
    return reasons


def _throughput_lost(problem: AllocationProblem, cuts: np.ndarray) -> np.ndarray:
    """Each job's throughput lost [tokens/s] at each level's `cuts` of its GPU power [W], both
    (P, J)."""
    before = problem.curves.uncapped_throughput
    return np.stack(
        [
            before
            - throughput_at_power(
                problem.curves, np.clip(problem.hi_w - c / problem.gpus, problem.lo_w, problem.hi_w)
            )
            for c in cuts
        ]
    )


def _jobs_doc(
    mix: JobMix, reasons: Mapping[str, str], max_cut_w: np.ndarray, power_sd_w: np.ndarray
) -> list[dict[str, Any]]:
    """Each job's largest cut [W] and the sd of its shed from its uncapped power [W], or why it
    is not counted."""
    return [
        {
            "id": job.id,
            "counted": job.id not in reasons,
            "max_reduction_w": float(max_cut_w[j]),
            "power_sd_w": float(power_sd_w[j]),
            **({"reason": reasons[job.id]} if job.id in reasons else {}),
        }
        for j, job in enumerate(mix.jobs)
    ]


def _job_curves(cuts_kw: np.ndarray, lost: np.ndarray) -> list[list[dict[str, float]]]:
    """Each job's own supply curve: facility kW shed against its throughput lost, from the
    levels' cuts at the meter [kW] and throughput lost [tokens/s], both (P, J)."""
    return [
        [
            {"facility_kw": kw, "throughput_loss": loss}
            for kw, loss in zip(job_kw, job_loss, strict=True)
        ]
        for job_kw, job_loss in zip(cuts_kw.T.tolist(), lost.T.tolist(), strict=True)
    ]


def _history_doc(used: list[Delivered], confidence: float, factor: float) -> dict[str, Any]:
    """The site's record that scaled firm kW: the events read, the quantile and the factor."""
    return {
        "events": [
            {
                "event_id": d.event_id,
                "requested_kw": d.requested_kw,
                "delivered_kw": d.delivered_kw,
                "ratio": d.delivered_kw / d.requested_kw,
            }
            for d in used
        ],
        "quantile": 1.0 - confidence,
        "factor": factor,
    }


def _supply_curve(
    curve_kw: np.ndarray, total: np.ndarray, before: np.ndarray
) -> list[dict[str, float]]:
    """The site's supply curve: facility kW shed against the throughput lost, absolute and as a
    share of the uncapped throughput `before`."""
    return [
        {"facility_kw": kw, "throughput_loss": loss, "throughput_loss_fraction": share}
        for kw, loss, share in zip(
            curve_kw.tolist(),
            total.tolist(),
            (total / max(before.sum(), 1e-300)).tolist(),
            strict=True,
        )
    ]


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


@dataclass(frozen=True)
class _Spread:
    """The standard deviations of the GPU shed [W] from each source of error."""

    #: S * se_k / k: the overhead factor's, in GPU watts (k times it is its sd at the meter)
    overhead_w: float
    pfi_w: float  #: sqrt(sum_j (dS_j/dPFI * se_j)^2): the PFIs', independent
    power_w: np.ndarray  #: per job sd_j: the uncapped powers', common-mode

    def sd_w(self) -> dict[str, float]:
        power_w = float(self.power_w.sum())  # common-mode: added linearly
        return {
            "overhead_factor": self.overhead_w,
            "pfi": self.pfi_w,
            "job_power": power_w,
            "total": math.sqrt(self.overhead_w**2 + self.pfi_w**2 + power_w**2),
        }


def _spread_w(
    mix: JobMix, counted: np.ndarray, max_cut_w: np.ndarray, power_uncertainty: float
) -> _Spread:
    """Each source's sd of the GPU shed (the module's docstring); `max_cut_w` per job [W]."""
    k, se_k = mix.overhead_factor, mix.overhead_factor_stderr
    shed_w = float(max_cut_w.sum())
    se = np.where(counted, [j.pfi_error for j in mix.jobs], 0.0)
    var_jobs = float(np.sum((mix.shed_per_pfi_w * se) ** 2)) if np.any(se > 0) else 0.0
    uncapped_w = mix.array("gpus") * mix.array("power_w")
    relative = np.array(
        [
            power_uncertainty if j.power_stderr_w is None else j.power_stderr_w / j.power_w
            for j in mix.jobs
        ]
    )
    # A job that draws less than believed sheds that much less, down to nothing: never more
    # than its whole cut (a cap above its true draw holds nothing back).
    power_w = np.where(counted, np.minimum(relative * uncapped_w, max_cut_w), 0.0)
    return _Spread(shed_w * se_k / k, math.sqrt(var_jobs), power_w)


def _firm_kw(mix: JobMix, shed_w: float, confidence: float, spread: _Spread) -> float:
    """`k*S - z_C * sd(F)` at the meter, within `[0, k*S]` [kW], before the history factor."""
    k = mix.overhead_factor
    z = NormalDist().inv_cdf(confidence)
    sd_w = k * spread.sd_w()["total"]
    return float(min(max(k * shed_w - z * sd_w, 0.0), k * shed_w) / 1000.0)


def history_factor(
    history: Sequence[Delivered], confidence: float
) -> tuple[float, list[Delivered]]:
    """What the site's record at the meter leaves of the model's firm kW, and the events it
    read: the `1 - confidence` quantile (linear between the ranked ratios, so one bad event
    among many does not set it alone) of delivered over requested, at most 1 (a site that
    delivered more than planned was lucky, or its loop made up the model's error: no reason
    to promise more than the model). 1 without events; events that asked for nothing do not
    count."""
    used = [d for d in history if d.requested_kw > 0.0 and math.isfinite(d.delivered_kw)]
    if not used:
        return 1.0, []
    ratios = np.array([max(d.delivered_kw / d.requested_kw, 0.0) for d in used])
    return min(float(np.quantile(ratios, 1.0 - confidence)), 1.0), used


def _check(
    window_s: float,
    confidence: float,
    reduction_kw: float | None,
    points: int,
    power_uncertainty: float,
) -> None:
    if not (math.isfinite(window_s) and window_s > 0):
        raise FlexModelError(f"window {window_s!r} s must be a positive number")
    if not (math.isfinite(confidence) and 0.0 < confidence < 1.0):
        raise FlexModelError(f"confidence {confidence!r} must lie strictly between 0 and 1")
    if reduction_kw is not None and not (math.isfinite(reduction_kw) and reduction_kw >= 0):
        raise FlexModelError(f"reduction {reduction_kw!r} kW must be a finite number of at least 0")
    if points < 2:
        raise FlexModelError("a supply curve needs at least two points")
    if not (math.isfinite(power_uncertainty) and 0.0 <= power_uncertainty < 1.0):
        raise FlexModelError(f"power uncertainty {power_uncertainty!r} must lie in [0, 1)")
