"""Benchmark and figures for synchronisation (docs/sync.md).

- the simulator: N = 1000 jobs, 600 s of simulated time at dt = T/200 (target < 10 s);
- the analysis of a 10k-job fleet (target < 100 ms);
- the locking threshold against the rate spread, and a gain sweep up and down (hysteresis);
- the onsets of harmonics 2 and 3 (300 jobs, spread 0.005) against the analysis' critical gain;
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


#: (duty, delay [s], harmonic): the delays where harmonic m attracts and the fundamental repels.
HARMONIC_CASES = ((0.25, 0.75, 2), (0.5, 0.5, 3))
HARMONIC_RATIOS = np.array([0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.4, 2.0])
ONSET_ORDER = 0.25  #: r_m well above random phases (1/sqrt(300) = 0.06; Rayleigh 0.14)


def harmonic_onset(duty: float, delay: float, m: int, spread: float = 0.005) -> dict[str, object]:
    """r_m against the gain in units of the analysis' critical gain, two seeds, and the gain at
    which the seeds' mean r_m first reaches ONSET_ORDER (interpolated)."""
    unit = analyse(T, duty, delay_s=delay, spread=spread, gain_per_s=1.0)
    predicted = float(unit.critical_per_s[0, m - 1] / unit.coupling_per_s[0, m - 1])
    orders = [
        [
            float(
                simulate_sync(
                    jobs=300,
                    period_s=T,
                    duty=duty,
                    delay_s=delay,
                    gain_per_s=ratio * predicted,
                    spread=spread,
                    duration_s=600,
                    seed=seed,
                ).final_order[m - 1]
            )
            for seed in (1, 2)
        ]
        for ratio in HARMONIC_RATIOS
    ]
    mean = np.mean(orders, axis=1)
    above = int(np.argmax(mean >= ONSET_ORDER))
    ratio = float(
        np.interp(ONSET_ORDER, mean[above - 1 : above + 1], HARMONIC_RATIOS[above - 1 : above + 1])
    )
    return {
        "duty": duty,
        "delay_s": delay,
        "m": m,
        "predicted_gain_per_s": predicted,
        "measured_gain_per_s": ratio * predicted,
        "gain_over_critical": HARMONIC_RATIOS.tolist(),
        "r_m_by_seed": orders,
    }


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
    harmonics = [harmonic_onset(*case) for case in HARMONIC_CASES]
    for h in harmonics:
        print(
            f"harmonic {h['m']} onset (r_m = {ONSET_ORDER}): measured "
            f"{h['measured_gain_per_s']:.3f}, predicted {h['predicted_gain_per_s']:.3f} rad/s",
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
        "harmonic_onsets": harmonics,
        "hysteresis": hysteresis,
    }
    (RESULTS / "sync.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
