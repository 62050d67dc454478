"""Benchmark: the site loop at the meter against the open-loop plan (results/closed_loop.json).

Random mismatched sites (`flexgate.lab.simsite.draw_truth`: PFI by the study's predictor error,
power per GPU by up to 15%, duty by up to 0.1, the overhead factor by up to 0.15, plus a
static load the declaration does not know), 100 simulated nodes of 8 GPUs each. For each, the
same event (20% of the declared GPU-attributable power) runs open loop and closed loop in the
same process, on a stepped clock (`flexgate.lab.simsite`), so a hundred events take minutes.

Delivered = the site's uncapped facility power (the meter's truth before the event: same
seed, no event) less the metered power, averaged over the loop's window; the error is
relative to the requested reduction. Reported per loop: delivered / requested (median, p95 of
the error), the time from the event's start until it stays within 2% and within 5%, and the
overshoot. Targets (issue 13): closed loop within 2% in the median and 5% at p95, settled
within three loop windows. The open-loop figures are the reference, as measured. The real-time
cross-check is `flexgate lab --mismatch` (docs/benchmarks.md).

    python bench/closed_loop_bench.py [--sites 50] [--event-s 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flexgate.lab.jobs import lab_jobs
from flexgate.lab.simsite import SimulatedSite, draw_truth

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NODES, GPUS_PER_NODE = 100, 8
DECLARED_K = 1.3
SHARE = 0.2
WARM_UP_S = 120.0


async def one_event(folder: Path, seed: int, tracking: bool, event_s: float) -> dict[str, Any]:
    declared = lab_jobs(NODES, GPUS_PER_NODE, seed)
    rng = np.random.default_rng(seed)
    truth = draw_truth(
        declared,
        overhead_factor=DECLARED_K,
        static_kw=float(rng.uniform(20.0, 200.0)),
        rng=rng,
    )
    site = SimulatedSite(
        declared,
        truth,
        declared_overhead_factor=DECLARED_K,
        tracking=tracking,
        noise_kw=0.5,
        seed=seed,
        folder=folder,
    )
    try:
        await site.start()
        requested = round(SHARE * DECLARED_K * site.book.mix().baseline_gpu_kw, 1)
        await site.run_for(WARM_UP_S)
        uncapped = site.meter.true_facility_kw()
        await site.tracker.pursue("ev", requested, None)
        started = site.clock.monotonic()
        trace = await site.run_for(event_s)
        window_s = site.tracker.config.window_s
    finally:
        site.close()
    times = np.array([t - started for t, _ in trace])
    metered = np.array([np.nan if kw is None else kw for _, kw in trace])
    per_sample = max(round(window_s / site.settings.meter_period_s), 1)
    smoothed = np.convolve(metered, np.ones(per_sample) / per_sample, mode="valid")
    delivered = uncapped - smoothed  # over the loop's window, ending at each sample
    error = (delivered - requested) / requested
    return {
        "seed": seed,
        "requested_kw": requested,
        "delivered_kw": float(delivered[-1]),
        "error": float(error[-1]),
        "overshoot": float(max(np.max(error), 0.0)),
        "settle_2pct_s": _settled(times[per_sample - 1 :], error, 0.02),
        "settle_5pct_s": _settled(times[per_sample - 1 :], error, 0.05),
        "window_s": window_s,
        "true_overhead_factor": truth.overhead_factor,
    }


def _settled(times: np.ndarray, error: np.ndarray, band: float) -> float | None:
    """From the event's start until the error stays within the band to the end [s]."""
    outside = np.nonzero(np.abs(error) > band)[0]
    if outside.size == 0:
        return float(times[0])
    if outside[-1] == len(error) - 1:
        return None  # never settled
    return float(times[outside[-1] + 1])


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    error = np.abs([r["error"] for r in runs])
    ratio = np.array([r["delivered_kw"] / r["requested_kw"] for r in runs])

    def times(key: str) -> dict[str, float | int | None]:
        settled = [r[key] for r in runs if r[key] is not None]
        return {
            "median_s": float(np.median(settled)) if settled else None,
            "p95_s": float(np.percentile(settled, 95)) if settled else None,
            "never": len(runs) - len(settled),
            "median_windows": (
                float(np.median([r[key] / r["window_s"] for r in runs if r[key] is not None]))
                if settled
                else None
            ),
        }

    return {
        "delivered_over_requested_median": float(np.median(ratio)),
        "abs_error_median": float(np.median(error)),
        "abs_error_p95": float(np.percentile(error, 95)),
        "overshoot_median": float(np.median([r["overshoot"] for r in runs])),
        "overshoot_max": float(np.max([r["overshoot"] for r in runs])),
        "within_2pct": times("settle_2pct_s"),
        "within_5pct": times("settle_5pct_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=50, help="random mismatched sites")
    parser.add_argument("--event-s", type=float, default=600.0, help="simulated event [s]")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="closed-loop-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {"open": [], "closed": []}
    begin = time.perf_counter()
    try:
        for seed in range(args.sites):
            for name, tracking in (("open", False), ("closed", True)):
                folder = tmp / f"{name}-{seed}"
                runs[name].append(asyncio.run(one_event(folder, seed, tracking, args.event_s)))
            print(
                f"site {seed}: open {runs['open'][-1]['error']:+.1%}, "
                f"closed {runs['closed'][-1]['error']:+.1%}",
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {
        "benchmark": "closed_loop",
        "sites": args.sites,
        "nodes": NODES,
        "gpus_per_node": GPUS_PER_NODE,
        "event_s": args.event_s,
        "requested_share_of_gpu_attributable": SHARE,
        "wall_s": time.perf_counter() - begin,
        "open_loop": summary(runs["open"]),
        "closed_loop": summary(runs["closed"]),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "closed_loop.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("open_loop", "closed_loop", "wall_s")}, indent=2))


if __name__ == "__main__":
    main()
