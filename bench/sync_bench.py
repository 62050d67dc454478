"""Benchmark and figures for synchronisation (docs/sync.md).

- the simulator: N = 1000 jobs, 600 s of simulated time at dt = T/200 (target < 10 s);
- the analysis of a 10k-job fleet (target < 100 ms);
- the locking threshold against the rate spread, and a gain sweep up and down (hysteresis);
- the plots in docs/img/.

    python bench/sync_bench.py      # writes bench/results/sync.json and docs/img/sync-*.png
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from flexgate.plots import plot_sync
from flexmodel.sync import analyse
from flexmodel.syncsim import gain_sweep, locking_gain, simulate_sync

ROOT = Path(__file__).resolve().parent.parent
RESULTS, IMAGES = ROOT / "bench" / "results", ROOT / "docs" / "img"
T = 2.0


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def sweep(spread: float, ratios: np.ndarray, throttle: str) -> dict[str, list[float]]:
    up, down = gain_sweep(spread, ratios * 2 * spread * 2 * np.pi / T, throttle=throttle)
    return {"gain_over_2gamma": ratios.tolist(), "r1_up": up, "r1_down": down}


def main() -> None:
    sim_s, run = timed(
        lambda: simulate_sync(
            jobs=1000, period_s=T, duty=0.5, delay_s=1.5, gain_per_s=0.2, duration_s=600
        )
    )
    print(
        f"simulate 1000 jobs x 600 s at T/200: {sim_s:.2f} s (r1 {run.final_order[0]:.3f}, "
        f"swing ratio {run.swing_ratio:.1f})",
        flush=True,
    )
    rng = np.random.default_rng(0)
    periods, duties = rng.uniform(1, 10, 10_000), rng.uniform(0.3, 0.9, 10_000)
    analyse(periods, duties, delay_s=1.0, window_s=0.5, spread=0.01)  # warm numpy up
    fleet_s = min(
        timed(lambda: analyse(periods, duties, delay_s=1.0, window_s=0.5, spread=0.01).verdict)[0]
        for _ in range(5)
    )
    print(f"analyse 10k jobs: {fleet_s * 1e3:.1f} ms", flush=True)
    spreads = [0.005, 0.01, 0.02, 0.03, 0.04]
    gains = [locking_gain(s, steps=8) for s in spreads]
    slope, offset = np.polyfit(spreads, gains, 1)
    print(
        f"locking threshold: slope {slope:.2f} rad/s per unit spread (theory 2w = "
        f"{4 * np.pi / T:.2f}), offset {offset:.4f} rad/s",
        flush=True,
    )
    ratios = np.array([0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 1.4, 1.7, 2.0])
    hysteresis = {"linear": sweep(0.01, ratios, "linear"), "cap": sweep(0.01, 2 * ratios, "cap")}
    IMAGES.mkdir(parents=True, exist_ok=True)
    figures = {  # name: (delay, gain, spread)
        "locking": (1.5, 0.3, 0.005),
        "anti-phase": (0.6, 0.3, 0.005),
        "clusters": (0.5, 0.5, 0.0),  # identical jobs: harmonic 3 locks into three groups
    }
    for name, (delay, gain, spread) in figures.items():
        example = simulate_sync(
            jobs=48,
            period_s=T,
            duty=0.5,
            delay_s=delay,
            gain_per_s=gain,
            spread=spread,
            noise=0.003,
            duration_s=300,
            seed=4,
        )
        plot_sync(example, IMAGES / f"sync-{name}.png")
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "benchmark": "sync",
        "simulate_1000_jobs_600_s": {
            "seconds": sim_s,
            "r1": float(run.final_order[0]),
            "swing_ratio": run.swing_ratio,
        },
        "analyse_10k_jobs_s": fleet_s,
        "threshold": {
            "spreads": spreads,
            "gains": gains,
            "slope": slope,
            "offset": offset,
            "theory_slope": 4 * np.pi / T,
        },
        "hysteresis": hysteresis,
    }
    (RESULTS / "sync.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
