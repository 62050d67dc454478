"""Benchmark: the scheduling experiment and flexibility quotes.

- `flexgate simulate` at the study's size (500 workloads x 100 jobs x 5 reductions x 4
  strategies), both PFI sources, timed end to end (generation included);
- a quote of a 10k-job mix: cold (curves built, nothing else cached), warm (the same mix
  again), and the curve building from the job-mix document on its own.

    python bench/simulate_bench.py        # writes bench/results/simulate.json
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np

from flexmodel.jobmix import parse_job_mix
from flexmodel.quote import quote
from flexmodel.simulate import simulate

RESULTS = Path(__file__).resolve().parent / "results"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def big_mix(jobs: int, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "overhead_factor": 1.3,
        "overhead_factor_stderr": 0.05,
        "jobs": [
            {
                "id": f"job-{i}",
                "gpus": int(rng.choice([8, 16, 32])),
                "power_w": float(rng.uniform(450, 690)),
                "throughput": float(rng.uniform(1e4, 2e5)),
                "pfi": float(rng.uniform(1.1, 2.6)),
                "pfi_stderr": float(rng.choice([0.0, 0.24])),
                "min_throughput_fraction": float(rng.choice([0.0, 0.5])),
                "duty": float(rng.uniform(0.6, 0.9)),
                "comm_power_fraction": float(rng.uniform(0.35, 0.7)),
                "remaining_s": float(rng.uniform(600, 86400)),
            }
            for i in range(jobs)
        ],
    }


def main() -> None:
    rows = []
    for source in ("predicted", "measured"):
        seconds, doc = timed(lambda source=source: simulate(pfi_source=source))
        at_30 = next(r for r in doc["results"] if r["reduction"] == 0.3)
        rows.append({"pfi_source": source, "seconds": seconds, "at_30": at_30})
        print(f"simulate 500x100x5x4 ({source}): {seconds:.2f} s", flush=True)
    document = big_mix(10_000)
    quote_row: dict[str, float] = {"jobs": 10_000}
    for per_job in (True, False):
        label = "" if per_job else "_without_per_job_curves"
        parse_s, mix = timed(lambda: parse_job_mix(document))  # parsing builds the curves
        run = functools.partial(quote, mix, reduction_kw=500.0, per_job_curves=per_job)
        cold_s, _ = timed(run)
        warm_s = min(timed(run)[0] for _ in range(5))
        quote_row |= {
            "parse_and_curves_s": parse_s,
            f"cold{label}_s": cold_s,
            f"warm{label}_s": warm_s,
        }
        print(
            f"quote 10k jobs{label.replace('_', ' ')}: cold {cold_s * 1e3:.1f} ms, "
            f"warm {warm_s * 1e3:.1f} ms (parse + curves {parse_s * 1e3:.0f} ms)",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    out = {"benchmark": "simulate", "simulate": rows, "quote": quote_row}
    (RESULTS / "simulate.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
