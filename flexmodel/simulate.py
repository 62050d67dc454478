"""The PFI study's scheduling experiment (docs/model.md, section 8), and beyond it.

For each of `workloads` generated job mixes and each global reduction (a fraction of the mix's
uncapped GPU power), every strategy chooses each job's mean power per GPU from what it knows:

- `equal`, `pfi` and `optimal` see each job's PFI only (measured or predicted) and plan on
  fleet-family curves built from it;
- `oracle` sees the true curves.

Each choice is then scored on the **true** curve at that power: the site holds each job at its
planned mean power, and the job makes what its real curve gives there. Every strategy uses the
same lower bound per job: the larger of its model's and its true power at the GPU's minimum cap
(running a job at its minimum cap is how that bound is measured). The oracle's answer is the
best on the true curves of its own optimum and every other strategy's choice (the true optimum
is at least as good as each of them), so it is a ceiling by construction.

`gap_closed[s] = (mean_s - mean_equal) / (mean_oracle - mean_equal)`, `None` where the gap is
below 1e-9 tokens/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flexmodel.allocate import allocate
from flexmodel.curves import (
    Curves,
    FamilyShape,
    family_curves,
    operating_point,
    throughput_at_power,
)
from flexmodel.errors import FlexModelError
from flexmodel.pfi import solve_insensitive_share
from flexmodel.problem import AllocationProblem
from flexmodel.workload import Workloads, generate

STRATEGIES = ("equal", "pfi", "optimal", "oracle")
PFI_SOURCES = ("measured", "predicted")
DEFAULT_REDUCTIONS = (0.0, 0.1, 0.2, 0.3, 0.4)
MIN_CAP_W, MAX_CAP_W = 200.0, 700.0
_GAP_FLOOR = 1e-9


def simulate(
    *,
    workloads: int = 500,
    jobs: int = 100,
    mix: str = "production",
    reductions: Sequence[float] = DEFAULT_REDUCTIONS,
    pfi_source: str = "predicted",
    seed: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the experiment; the answer has the JSON shape docs/cli.md shows (`flexgate simulate`).

    `progress(done, total)` is called after each workload.
    """
    if pfi_source not in PFI_SOURCES:
        raise FlexModelError(f"unknown PFI source '{pfi_source}' (choose from measured, predicted)")
    levels = [float(r) for r in reductions]
    if not levels or any(not 0.0 <= r < 1.0 for r in levels):
        raise FlexModelError("reductions must be fractions in [0, 1)")
    sample = generate(workloads, jobs, mix=mix, seed=seed)
    tokens = per_job_tokens(sample, levels, pfi_source, progress)  # (W, R, S)
    mean = tokens.mean(axis=0)
    results = []
    for i, level in enumerate(levels):
        by = dict(zip(STRATEGIES, mean[i], strict=True))
        gap = by["oracle"] - by["equal"]
        closed = {
            s: (None if gap < _GAP_FLOOR else float((by[s] - by["equal"]) / gap))
            for s in ("pfi", "optimal")
        }
        results.append(
            {
                "reduction": level,
                "tokens_per_s_per_job": {s: float(v) for s, v in by.items()},
                "gap_closed": closed,
            }
        )
    return {
        "workloads": workloads,
        "jobs": jobs,
        "mix": mix,
        "pfi_source": pfi_source,
        "seed": seed,
        "results": results,
        "predictor": sample.predictor.as_dict(),
        "pfi_error_rmse": float(
            np.sqrt(np.mean((sample.predicted_pfi - sample.measured_pfi) ** 2))
        ),
    }


def per_job_tokens(
    sample: Workloads,
    reductions: Sequence[float],
    pfi_source: str,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Mean true tokens/s per job, shape (workloads, reductions, strategies)."""
    known = sample.measured_pfi if pfi_source == "measured" else sample.predicted_pfi
    model = model_curves(sample, known)
    truth = sample.true_curves
    lo = np.maximum(operating_point(model, MIN_CAP_W)[0], operating_point(truth, MIN_CAP_W)[0])
    out = np.empty((sample.workloads, len(reductions), len(STRATEGIES)))
    for w in range(sample.workloads):
        rows = sample.group(w)
        planned = _problem(model.select(rows), sample, rows, lo, known)
        real = _problem(truth.select(rows), sample, rows, lo, sample.measured_pfi)
        total_w = float(planned.gpus @ planned.hi_w)
        for i, level in enumerate(reductions):
            powers = [allocate(planned, level * total_w, s).power_w for s in STRATEGIES[:3]]
            powers.append(allocate(real, level * total_w, "oracle").power_w)
            scores = np.array([throughput_at_power(real.curves, p).mean() for p in powers])
            scores[3] = scores.max()  # the true optimum is at least every strategy's answer
            out[w, i] = scores
        if progress is not None:
            progress(w + 1, sample.workloads)
    return out


def model_curves(sample: Workloads, pfi: np.ndarray) -> Curves:
    """What a planner that knows only each job's PFI (and its waveform) believes."""
    shape = FamilyShape.of(
        power_w=sample.power_w,
        duty=sample.duty,
        comm_power_fraction=sample.comm_power_fraction,
        min_cap_w=MIN_CAP_W,
        max_cap_w=MAX_CAP_W,
    )
    m = solve_insensitive_share(pfi, sample.grid_w, shape, clip=True)
    return family_curves(shape, m, throughput=sample.throughput, period_s=sample.period_s)


def _problem(
    curves: Curves, sample: Workloads, rows: slice, lo: np.ndarray, pfi: np.ndarray
) -> AllocationProblem:
    return AllocationProblem(
        curves=curves,
        gpus=sample.gpus[rows],
        weights=np.ones(sample.jobs),
        lo_w=lo[rows],
        pfi=pfi[rows],
    )
