"""Benchmark: `optimal` allocation against scipy's HiGHS LP on the same problem, in one run.

Concave instances: fleet-family curves at constant power (duty 1, clock-insensitive share in
[0, 0.6]), which are concave, so the LP over their piecewise-linear segments is the exact
problem. Both solvers get the same segments; we report each one's time, the relative
objective difference and the speed ratio. HiGHS runs up to 10k jobs (about a minute there);
`optimal` alone runs at 100k. Non-concave instances (two-level waveforms) report time and the
gap bound. Each case runs in its own process, so its peak RSS is its own.

    python bench/allocate_bench.py            # all cases, writes bench/results/allocate.json
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import scipy
from scipy import sparse
from scipy.optimize import linprog

from flexmodel.allocate import allocate
from flexmodel.curves import FamilyShape, family_curves
from flexmodel.problem import AllocationProblem, build_problem

RESULTS = Path(__file__).resolve().parent / "results"
REDUCTION_SHARE = 0.3  # of the largest feasible reduction
HIGHS_MAX_JOBS = 10_000
CASES = [("concave", n) for n in (100, 1_000, 10_000, 100_000)] + [
    ("nonconcave", n) for n in (100, 1_000, 10_000, 100_000)
]


def instance(kind: str, jobs: int, seed: int = 7) -> AllocationProblem:
    rng = np.random.default_rng(seed)
    concave = kind == "concave"
    # Drawn in this order so that every instance stays the one earlier results were measured on.
    power_w, throughput = rng.uniform(450.0, 690.0, jobs), rng.uniform(1e3, 5e4, jobs)
    duty = 1.0 if concave else rng.uniform(0.5, 0.9, jobs)
    comm_power_fraction = 1.0 if concave else rng.uniform(0.3, 0.7, jobs)
    shape = FamilyShape.of(
        power_w=power_w,
        duty=duty,
        comm_power_fraction=comm_power_fraction,
        min_cap_w=200.0,
        max_cap_w=700.0,
    )
    curves = family_curves(shape, rng.uniform(0.0, 0.6, jobs), throughput=throughput, period_s=2.0)
    return build_problem(
        curves,
        gpus=rng.choice([8, 16, 32], jobs),
        min_cap_w=200.0,
        min_throughput_fraction=0.0,
        protected=np.zeros(jobs, bool),
        weights=np.ones(jobs),
        pfi=np.ones(jobs),
    )


def highs_loss(problem: AllocationProblem, reduction_w: float) -> float:
    """The same problem as an LP: segment watts in [0, width], cost per watt, sum = R."""
    c = problem.curves
    n = problem.gpus[:, None]
    width = (n * np.diff(c.power_w, axis=1)).ravel()
    lost = (problem.weights[:, None] * np.diff(c.throughput, axis=1)).ravel()
    keep = width > 0
    width, cost = width[keep], lost[keep] / width[keep]
    res = linprog(
        cost,
        A_eq=sparse.csr_array(np.ones((1, width.size))),
        b_eq=[reduction_w],
        bounds=np.column_stack([np.zeros_like(width), width]),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    return float(res.fun)


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = np.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def run_case(kind: str, jobs: int) -> dict:
    problem = instance(kind, jobs)
    reduction = REDUCTION_SHARE * float(problem.max_cut_w.sum())
    repeats = 5 if jobs <= 10_000 else 3
    # Cold: a fresh problem each time, so the hulls are built inside the timing, as HiGHS
    # builds its own model. Warm: the same problem again (a quote's supply curve does this).
    t_opt, result = timed(lambda: allocate(replace(problem), reduction, "optimal"), repeats)
    t_warm, _ = timed(lambda: allocate(problem, reduction, "optimal"), repeats)
    row = {
        "kind": kind,
        "jobs": jobs,
        "segments": int(problem.curves.cap_w.shape[1] - 1) * jobs,
        "optimal_s": t_opt,
        "optimal_warm_s": t_warm,
        "optimal_loss": result.value_before - result.value,
        "gap_bound_relative": result.optimality_gap_bound / result.value,
    }
    if kind == "concave" and jobs <= HIGHS_MAX_JOBS:
        t_lp, lp = timed(lambda: highs_loss(problem, reduction), 1 if jobs >= 10_000 else 3)
        row |= {
            "highs_s": t_lp,
            "highs_loss": lp,
            # Relative to the objective (throughput kept), as the target is stated.
            "objective_difference_relative": abs(lp - row["optimal_loss"]) / result.value,
            "speedup": t_lp / t_opt,
        }
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| curves | jobs | optimal (cold) | optimal (warm) | HiGHS LP | speed-up | objective diff "
        "| gap bound | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lp = f"{r['highs_s'] * 1e3:,.1f} ms" if "highs_s" in r else "-"
        up = f"{r['speedup']:,.0f}x" if "speedup" in r else "-"
        diff = f"{r['objective_difference_relative']:.1e}" if "speedup" in r else "-"
        lines.append(
            f"| {r['kind']} | {r['jobs']:,} | {r['optimal_s'] * 1e3:,.2f} ms | "
            f"{r['optimal_warm_s'] * 1e3:,.2f} ms | {lp} | {up} | "
            f"{diff} | {r['gap_bound_relative']:.1e} | {r['peak_rss_mib']:.0f} MiB |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3:  # one case, in this process
        print(json.dumps(run_case(sys.argv[1], int(sys.argv[2]))))
        return
    rows = []
    for kind, jobs in CASES:
        print(f"{kind} {jobs:,} jobs ...", file=sys.stderr, flush=True)
        out = subprocess.run(
            [sys.executable, __file__, kind, str(jobs)], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(out.stdout))
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "benchmark": "allocate",
        "reduction_share_of_max": REDUCTION_SHARE,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
        "rows": rows,
    }
    (RESULTS / "allocate.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
