"""Where a simulated population of jobs locks (docs/sync.md, "What the simulator reproduces"):
the smallest gain at which the order parameter reaches a level, and the order swept up and down
over gains from one run's phases to the next (hysteresis), both on `flexmodel.syncsim`.
"""

from __future__ import annotations

import numpy as np

from flexmodel.curves import Array
from flexmodel.syncsim import simulate_sync


def locking_gain(
    spread: float,
    *,
    jobs: int = 300,
    period_s: float = 2.0,
    delay_s: float = 1.5,
    duration_s: float = 300.0,
    seed: int = 3,
    order: float = 0.4,
    steps: int = 6,
) -> float:
    """The smallest gain [rad/s] at which r1 reaches `order` (bisection on a log scale).

    Searched between 0.3 and 3 times the Ott-Antonsen threshold `2 * spread * w`, with d = 1/2
    and the delay at which the fundamental attracts (default 0.75 T).
    """
    theory = 2.0 * spread * 2.0 * np.pi / period_s
    lo, hi = 0.3 * theory, 3.0 * theory
    for _ in range(steps):
        mid = float(np.sqrt(lo * hi))
        run = simulate_sync(
            jobs=jobs,
            period_s=period_s,
            duty=0.5,
            delay_s=delay_s,
            gain_per_s=mid,
            spread=spread,
            duration_s=duration_s,
            seed=seed,
        )
        lo, hi = (lo, mid) if run.final_order[0] > order else (mid, hi)
    return float(np.sqrt(lo * hi))


def gain_sweep(
    spread: float,
    gains: Array,
    *,
    jobs: int = 300,
    period_s: float = 2.0,
    delay_s: float = 1.5,
    duration_s: float = 300.0,
    seed: int = 3,
    throttle: str = "linear",
) -> tuple[list[float], list[float]]:
    """r1 at each gain, sweeping up then down, each run starting from the last one's phases
    (the same jobs throughout): (up, down), both in the order of `gains`."""
    phases: Array | None = None
    results: list[float] = []
    for gain in [*gains, *gains[::-1]]:
        run = simulate_sync(
            jobs=jobs,
            period_s=period_s,
            duty=0.5,
            delay_s=delay_s,
            gain_per_s=float(gain),
            spread=spread,
            duration_s=duration_s,
            seed=seed,
            initial_phases=phases,
            throttle=throttle,
        )
        phases = run.final_phases
        results.append(float(run.final_order[0]))
    return results[: len(gains)], results[len(gains) :][::-1]
