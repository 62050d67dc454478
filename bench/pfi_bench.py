"""Benchmark: PFI measured on site by probing, against the truth, as a function of probe time.

Jobs of the PFI study's types (`flexmodel.workload.JOB_TYPES`, each job's true PFI the type's
with the study's job-to-job spread, on the type's grid), their waveforms drawn from the
workload model's ranges (period log-uniform 1 to 10 s, duty, communication power), run on
simulated GPUs with noise: 5 W per sample, iterations jittering by 2%, a slow drift of 5 W.
The gateway knows none of their PFIs: each job is probed as `flexgate characterise` would, from
its declared curve (the fleet default), its uncapped level and three caps down to its probe
floor (75% of its throughput by that curve), each held for P iteration periods
(`flexgate.probesim`), and the agent's points are fitted by the one sweep rule
(`gateway.services.curves.fit_points`).

Reported for each P: the PFI error against the truth *on the probed grid* (Eq. 1 on the true
curve at the caps the fit kept; nothing extrapolated), median and p90, absolute and relative;
how often the stated standard error covers the error (|error| <= 1.96 se: 95% if it is honest);
the share of jobs whose fit is good enough to replace the declared curve (se <= 0.15); the
probe's length; and the throughput lost while probing, as a share of the job's throughput over
the probe and as seconds of the job's uncapped run.

    python bench/pfi_bench.py            # writes bench/results/pfi.json
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

from agents.irregularity import Irregularity
from flexgate.probesim import run_probe
from flexmodel.jobmix import parse_job_mix
from flexmodel.pfi import pfi_of_sweep
from flexmodel.workload import (
    COMM_POWER_FRACTION,
    DUTY,
    JOB_TYPES,
    PERIOD_S,
    PFI_SPREAD,
    POWER_W,
)
from gateway.services.characterise import probe_caps
from gateway.services.curves import fit_points, points_of, verdict

RESULTS = Path(__file__).resolve().parent / "results"
JOBS = 60
PERIODS = (5.0, 10.0, 20.0, 40.0)
LEVELS = 3
FLOOR = 0.75
GOOD_STDERR = 0.15
NOISE_W = 5.0
IRREGULARITY = Irregularity(jitter=0.02, drift_w=5.0, drift_period_s=300.0)


def draw_jobs(count: int, seed: int = 11) -> list[dict]:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(count):
        kind = JOB_TYPES[int(rng.integers(len(JOB_TYPES)))]
        lo, hi = POWER_W[(kind.group, kind.task)]
        jobs.append(
            {
                "id": f"{kind.name}-{i}",
                "gpus": 8,
                "power_w": float(rng.uniform(lo, hi)),
                "throughput": 10000.0,
                "pfi": float(kind.pfi * math.exp(rng.normal(0.0, PFI_SPREAD))),
                "pfi_grid_w": list(kind.grid_w),
                "period_s": float(math.exp(rng.uniform(*np.log(PERIOD_S)))),
                "duty": float(rng.uniform(*DUTY)),
                "comm_power_fraction": float(rng.uniform(*COMM_POWER_FRACTION)),
            }
        )
    return jobs


def probe_once(truth: dict, periods: float, seed: int) -> dict:
    declared = {k: v for k, v in truth.items() if k not in ("pfi", "pfi_grid_w")}
    caps = probe_caps(parse_job_mix({"jobs": [declared]}), 0, FLOOR, LEVELS)
    run = run_probe(
        truth, caps, periods=periods, seed=seed, noise_w=NOISE_W, irregularity=IRREGULARITY
    )
    points = points_of(run.reading, run.job, "probe", "bench")
    fit = fit_points(points, name=truth["id"])
    out = {"job": truth["id"], "caps_w": caps, "levels_measured": len(points), "fit": None}
    # Throughput lost while probing: each level's hold at its true throughput.
    x = run.job.throughput
    holds = [periods * x / run.truth[c][1] * run.job.period_s for c in caps]
    lost = sum(h * (1.0 - run.truth[c][1] / x) for c, h in zip(caps, holds, strict=True))
    out |= {
        "probe_s": run.seconds,
        "lost_share": lost / sum(holds),
        "lost_uncapped_s": lost,
    }
    if fit.get("pfi") is None:
        out["why"] = fit.get("error")
        return out
    true_on_grid = pfi_of_sweep([(c, *run.truth[c]) for c in fit["grid_w"]]).pfi
    out["fit"] = {
        "pfi": fit["pfi"],
        "pfi_stderr": fit["pfi_stderr"],
        "truth": true_on_grid,
        "declared_truth": truth["pfi"],
        "grid_w": fit["grid_w"],
        "good": verdict(fit, GOOD_STDERR) is None,
    }
    return out


def summarise(rows: list[dict], periods: float) -> dict:
    fitted = [r for r in rows if r["fit"]]
    err = np.array([abs(r["fit"]["pfi"] - r["fit"]["truth"]) for r in fitted])
    rel = np.array([e / r["fit"]["truth"] for e, r in zip(err, fitted, strict=True)])
    se = np.array([r["fit"]["pfi_stderr"] for r in fitted])
    return {
        "periods_per_level": periods,
        "jobs": len(rows),
        "fitted": len(fitted),
        "pfi_error_median": float(np.median(err)),
        "pfi_error_p90": float(np.percentile(err, 90)),
        "pfi_relative_error_median": float(np.median(rel)),
        "pfi_relative_error_p90": float(np.percentile(rel, 90)),
        "stated_stderr_median": float(np.median(se)),
        "covered_by_1_96_se": float(np.mean(err <= 1.96 * se)),
        "good_enough_share": float(np.mean([r["fit"]["good"] for r in fitted])),
        "levels_measured_median": float(np.median([r["levels_measured"] for r in rows])),
        "probe_s_median": float(np.median([r["probe_s"] for r in rows])),
        "probe_s_p90": float(np.percentile([r["probe_s"] for r in rows], 90)),
        "throughput_lost_share_median": float(np.median([r["lost_share"] for r in rows])),
        "throughput_lost_uncapped_s_median": float(np.median([r["lost_uncapped_s"] for r in rows])),
    }


def main() -> None:
    jobs = draw_jobs(JOBS)
    started = time.perf_counter()
    results, detail = [], {}
    for periods in PERIODS:
        rows = [probe_once(job, periods, seed=i) for i, job in enumerate(jobs)]
        results.append(summarise(rows, periods))
        detail[str(periods)] = rows
        print(json.dumps(results[-1]), file=sys.stderr)
    doc = {
        "bench": "pfi",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "jobs": JOBS,
        "levels": LEVELS,
        "probe_floor": FLOOR,
        "noise_w": NOISE_W,
        "irregularity": {"jitter": IRREGULARITY.jitter, "drift_w": IRREGULARITY.drift_w},
        "target": "median PFI error <= 0.10 after one probe of 20 periods per level",
        "target_met": next(r for r in results if r["periods_per_level"] == 20.0)["pfi_error_median"]
        <= 0.10,
        "results": results,
        "wall_s": time.perf_counter() - started,
        "detail": detail,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pfi.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in results:
        print(
            f"P={r['periods_per_level']:>4g}: PFI error median {r['pfi_error_median']:.3f} "
            f"p90 {r['pfi_error_p90']:.3f}, covered {100 * r['covered_by_1_96_se']:.0f}%, "
            f"good {100 * r['good_enough_share']:.0f}%, probe {r['probe_s_median']:.0f} s, "
            f"lost {100 * r['throughput_lost_share_median']:.1f}%"
        )


if __name__ == "__main__":
    main()
