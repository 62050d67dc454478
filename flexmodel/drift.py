"""Probes that measure their own drift: uncapped reference periods bracket the capped levels.

A job's throughput and power drift while it is probed (its data, its thermals, a neighbour):
a probe that steps its uncapped level first and then goes down reads a drift of 1% across the
probe as throughput lost to the caps, and biases the PFI (on `examples/sweep.csv`'s curve,
grid 400-700 W, true PFI 2.036: 1.878 at 1% drift, 1.748 at 2%; docs/model.md, section 2).

`probe_sequence` plans the levels: the uncapped level first, the caps going down, the uncapped
level again at the end and, in a long probe, between every `reference_every` capped levels.
`fit_probe` reads the levels in the order run (each with the time of its middle):

1. the reference levels (those at the uncapped cap) give the drift: a straight line in time
   fitted to their power and to their throughput, each relative to their mean (least squares;
   two references: the line through them);
2. every level is divided by its drift at its time: the capped levels are then as they would
   have been at the references' mean time, and the references all repeats of one level;
3. `flexmodel.sweeps.fit_sweep` reads the corrected points by the one rule, the uncapped point
   the mean of the corrected references (`reference_runs` of them);
4. the slope's standard error (from the references' scatter about the line with three or
   more, else from the noise floor) is carried into the PFI's error: the PFI is recomputed with
   each slope moved by its standard error, and the changes are added in quadrature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from flexmodel.curves import Array
from flexmodel.errors import InvalidSweepError
from flexmodel.sweeps import DEFAULT_NOISE, MeasuredSweep, fit_sweep, pfi_with_error

#: Degrees of freedom the stated noise counts for beside the references' scatter about their
#: line (a probe's references are few: three give one degree of freedom).
PRIOR_DOF = 4


@dataclass(frozen=True)
class ProbeLevel:
    cap_w: float
    time_s: float  #: the middle of the level's measured stretch [s]
    power_w: float  #: mean power per GPU [W]
    throughput: float


@dataclass(frozen=True)
class DriftFit:
    sweep: MeasuredSweep  #: the corrected sweep; its `pfi_stderr` includes the drift's term
    power_drift_per_s: float  #: relative change of power per second
    throughput_drift_per_s: float  #: relative change of throughput per second
    power_drift_stderr_per_s: float
    throughput_drift_stderr_per_s: float
    pfi_drift_stderr: float  #: the drift's share of the PFI's standard error
    references: int


def probe_sequence(caps_w: list[float], reference_every: int | None = None) -> list[float]:
    """The caps in the order a probe runs them: `caps_w` (uncapped first, then going down), the
    uncapped level again at the end and after every `reference_every` capped levels (None:
    only at the ends) [W]."""
    return [caps_w[i] for i in probe_steps(len(caps_w) - 1, reference_every)]


def probe_steps(levels: int, reference_every: int | None = None) -> list[int]:
    """`probe_sequence` by level: 0 the uncapped level, 1 to `levels` the caps going down."""
    out = [0]
    for i in range(1, levels + 1):
        out.append(i)
        if reference_every and i % reference_every == 0 and i < levels:
            out.append(0)
    out.append(0)
    return out


def fit_probe(
    levels: list[ProbeLevel],
    *,
    name: str = "probe",
    noise: float = DEFAULT_NOISE,
    power_noise: float | None = None,
) -> DriftFit:
    """The probe's sweep with its drift measured and removed (see the module's docstring);
    `noise` and `power_noise` as `fit_sweep` takes them (one level's relative noise)."""
    noise_p = noise if power_noise is None else power_noise
    uncapped = max(level.cap_w for level in levels)
    refs = [lv for lv in levels if lv.cap_w == uncapped]
    if len(refs) < 1 or len(levels) - len(refs) < 1:
        raise InvalidSweepError(f"{name}: needs an uncapped level and a capped one")
    t_ref = np.array([lv.time_s for lv in refs])
    t_mid = float(t_ref.mean())
    sxx = float(np.sum((t_ref - t_mid) ** 2))
    p_slope, p_se, p_sigma = _slope(t_ref, np.array([lv.power_w for lv in refs]), sxx, noise_p)
    t_slope, t_se, t_sigma = _slope(t_ref, np.array([lv.throughput for lv in refs]), sxx, noise)
    points = _pooled_points(_corrected(levels, t_mid, p_slope, t_slope), uncapped)
    # The references' scatter about their line is noise the sweep's points carry too.
    sweep = fit_sweep(
        points, name=name, noise=min(max(noise, t_sigma), 0.5), power_noise=min(p_sigma, 0.5)
    )
    k = len(refs)
    if sweep.pfi is None:
        return DriftFit(sweep, p_slope, t_slope, p_se, t_se, 0.0, k)
    # The uncapped point is the mean of k references: its noise is s / sqrt(k).
    kept = sweep.kept
    base, base_se = pfi_with_error(
        sweep.fit_power_w[kept],
        sweep.fit_throughput[kept],
        sweep.power_noise_fraction,
        throughput_noise=sweep.throughput_noise_fraction,
        reference_repeats=k * sweep.repeats,
    )
    moves = ((p_slope + p_se, t_slope), (p_slope, t_slope + t_se))
    drift_var = _drift_variance(levels, t_mid, uncapped, points, sweep, base, moves)
    drift_se = math.sqrt(drift_var)
    sweep = replace(sweep, pfi=base, pfi_stderr=math.sqrt(base_se**2 + drift_var))
    return DriftFit(sweep, p_slope, t_slope, p_se, t_se, drift_se, k)


def _corrected(
    levels: list[ProbeLevel], t_mid: float, p_rate: float, t_rate: float
) -> list[tuple[float, float, float, float]]:
    """Each level (cap [W], time [s], power [W], throughput) divided by its drift at its time:
    relative `p_rate` and `t_rate` per second from `t_mid` [s]."""
    return [
        (
            lv.cap_w,
            lv.time_s,
            lv.power_w / (1.0 + p_rate * (lv.time_s - t_mid)),
            lv.throughput / (1.0 + t_rate * (lv.time_s - t_mid)),
        )
        for lv in levels
    ]


def _drift_variance(
    levels: list[ProbeLevel],
    t_mid: float,
    uncapped: float,
    points: list[tuple[float, float, float]],
    sweep: MeasuredSweep,
    base: float,
    moves: tuple[tuple[float, float], ...],
) -> float:
    """The drift's share of the PFI's variance: the PFI `base` recomputed with the slopes moved
    (`moves`, each a power and a throughput slope [1/s]), the changes squared and summed.
    `points` are the sweep's points as corrected by the fitted slopes."""
    kept = sweep.kept
    drift_var = 0.0
    for p_rate, t_rate in moves:
        moved = np.array(_pooled_points(_corrected(levels, t_mid, p_rate, t_rate), uncapped))
        # The same kept caps, on the moved values scaled as the fit scales the measured ones.
        scale_p = moved[:, 1] / np.array(points)[:, 1]
        scale_t = moved[:, 2] / np.array(points)[:, 2]
        pfi_moved, _ = pfi_with_error(
            (sweep.fit_power_w * scale_p)[kept],
            (sweep.fit_throughput * scale_t)[kept],
            sweep.power_noise_fraction,
        )
        drift_var += (pfi_moved - base) ** 2
    return drift_var


def _slope(t: Array, values: Array, sxx: float, noise: float) -> tuple[float, float, float]:
    """The relative drift per second through the references, its standard error, and one
    reference's noise: the stated noise, pooled with their scatter about the line with three
    or more."""
    if t.size < 2 or sxx <= 0:
        return 0.0, 0.0, noise
    rel = values / values.mean()
    slope = float(np.sum((t - t.mean()) * (rel - 1.0)) / sxx)
    sigma = noise
    if t.size >= 3:
        # The stated noise counts as PRIOR_DOF degrees of freedom beside the references' own
        # scatter: a floor taken as `max` would overstate the noise whenever a scatter of one
        # or two degrees of freedom happens to come out high (and those are most of them).
        resid = rel - 1.0 - slope * (t - t.mean())
        dof = t.size - 2
        squares = float(np.sum(resid**2)) + PRIOR_DOF * noise**2
        sigma = math.sqrt(squares / (dof + PRIOR_DOF))
    return slope, sigma / math.sqrt(sxx), sigma


def _pooled_points(
    rows: list[tuple[float, float, float, float]], uncapped: float
) -> list[tuple[float, float, float]]:
    """One point per cap: the corrected references pooled into the uncapped one (their mean),
    a capped level run twice pooled likewise."""
    by_cap: dict[float, list[tuple[float, float]]] = {}
    for cap, _, power, thr in rows:
        by_cap.setdefault(cap, []).append((power, thr))
    return [
        (cap, float(np.mean([p for p, _ in vals])), float(np.mean([t for _, t in vals])))
        for cap, vals in sorted(by_cap.items())
    ]
