"""Independent references for the allocation tests: the problem as an LP and as a MILP."""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from flexmodel.curves import stack, sweep_curve
from flexmodel.problem import AllocationProblem, build_problem


def pwl_problem(
    jobs: list[tuple[int, list[float], list[float]]], weights=None
) -> AllocationProblem:
    """Jobs given as (gpus, powers ascending, throughputs ascending); cap = power."""
    curves = stack(
        [
            sweep_curve(list(zip(p, p, x, strict=True)), period_s=1.0, name=f"job {i}")
            for i, (_, p, x) in enumerate(jobs)
        ]
    )
    n = len(jobs)
    return build_problem(
        curves,
        gpus=[g for g, _, _ in jobs],
        min_cap_w=np.zeros(n),
        min_throughput_fraction=np.zeros(n),
        protected=np.zeros(n, bool),
        weights=np.ones(n) if weights is None else weights,
        pfi=np.ones(n),
    )


def segments(jobs, weights=None):
    """(widths, slopes, job index) of every segment cut from the top, in whole-job watts."""
    widths, slopes, owner = [], [], []
    for j, (g, p, x) in enumerate(jobs):
        w = 1.0 if weights is None else weights[j]
        for k in range(len(p) - 1, 0, -1):
            width = g * (p[k] - p[k - 1])
            widths.append(width)
            slopes.append(w * (x[k] - x[k - 1]) / width)
            owner.append(j)
    return np.array(widths), np.array(slopes), np.array(owner)


def lp_min_loss(jobs, reduction_w, weights=None) -> float:
    """HiGHS LP: the least weighted throughput lost cutting `reduction_w` (convex relaxation)."""
    widths, slopes, _ = segments(jobs, weights)
    res = linprog(
        slopes,
        A_eq=np.ones((1, len(widths))),
        b_eq=[reduction_w],
        bounds=list(zip(np.zeros_like(widths), widths, strict=True)),
        method="highs",
    )
    assert res.status == 0, res.message
    return float(res.fun)


def milp_min_loss(jobs, reduction_w, weights=None) -> float:
    """Exact optimum on the real (non-concave) curves: incremental MILP formulation."""
    widths, slopes, owner = segments(jobs, weights)
    n = len(widths)
    # Variables: t (segment watts, continuous) then y (segment full, binary) per segment.
    c = np.concatenate([slopes, np.zeros(n)])
    rows, lo, hi = [np.concatenate([np.ones(n), np.zeros(n)])], [reduction_w], [reduction_w]
    for i in range(n):
        r = np.zeros(2 * n)
        r[i], r[n + i] = 1.0, -widths[i]  # t_i >= width_i * y_i
        rows.append(r), lo.append(0.0), hi.append(np.inf)
        if i + 1 < n and owner[i + 1] == owner[i]:
            r = np.zeros(2 * n)
            r[i + 1], r[n + i] = 1.0, -widths[i + 1]  # t_{i+1} <= width_{i+1} * y_i
            rows.append(r), lo.append(-np.inf), hi.append(0.0)
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=np.concatenate([np.zeros(n), np.ones(n)]),
        bounds=Bounds(np.zeros(2 * n), np.concatenate([widths, np.ones(n)])),
        options={"mip_rel_gap": 1e-10},  # HiGHS stops at 1e-4 by default: not exact enough
    )
    assert res.status == 0, res.message
    return float(res.fun)
