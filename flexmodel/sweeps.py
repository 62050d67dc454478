"""Measured sweeps read with their noise: the one rule `flexgate pfi` and job mixes share.

A sweep is points `(cap_w, power_w, throughput)`, the highest cap the uncapped run
(MODEL.md sections 2 and 3). `fit_sweep`:

1. checks the points: two or more, distinct caps, positive uncapped power and throughput;
2. fits power and throughput monotone in the cap (isotonic: pool adjacent violators), and takes
   the measurement noise `noise_fraction` (one point's standard deviation, relative) as the
   larger of the given floor and the scatter of the points about that fit, at most
   `max(MAX_NOISE, floor)`;
3. refuses a sweep where power or throughput rises as the cap falls by more than the margin
   (`BINDING_SIGMAS` standard deviations of the difference of two points): that is no noise,
   but rows mixed up or another job;
4. sets aside, and reports, the capped points whose throughput is within that margin of the
   uncapped run's: the cap did not bind beyond the noise, and Eq. 1, which divides by the
   throughput lost, is undefined or meaningless there;
5. gives the PFI (Eq. 1 on the fit at the kept caps) with its standard error (first-order
   propagation of the noise), and Eq. 1 on the kept points as measured, for comparison with
   the study's values. The PFI is on the kept caps' grid (`grid_w`): nothing is extrapolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import Array, Curves, sweep_curve
from flexmodel.errors import InvalidSweepError
from flexmodel.pfi import pfi_of_sweep

#: One point's throughput and mean power noise when nothing says otherwise: 0.5% (relative).
DEFAULT_NOISE = 0.005
#: Scatter above this is not noise: a sweep departing further from monotone is refused.
MAX_NOISE = 0.02
#: A cap binds when it lowers throughput by more than this many standard deviations of the
#: difference of two points (each with the noise): about 1.4% at the default noise.
BINDING_SIGMAS = 2.0
#: Even without noise, a cap binds only where it lowered throughput by more than this.
_LEAST_LOSS = 1e-9

Point = tuple[float, float, float]


@dataclass(frozen=True)
class SetAside:
    cap_w: float
    power_w: float
    throughput: float
    reason: str


@dataclass(frozen=True)
class MeasuredSweep:
    cap_w: Array  #: every cap, ascending [W]
    power_w: Array  #: measured mean power per GPU [W]
    throughput: Array  #: measured throughput
    fit_power_w: Array  #: the monotone fit of power [W]
    fit_throughput: Array  #: the monotone fit of throughput
    kept: Array  #: bool: the uncapped point and the caps that bound beyond the noise
    noise_fraction: float  #: one point's relative standard deviation used
    set_aside: tuple[SetAside, ...]
    pfi: float | None  #: Eq. 1 on the fit at the kept caps; None when no cap bound
    pfi_stderr: float | None
    pfi_measured: float | None  #: Eq. 1 on the kept points as measured (the study's value)

    @property
    def grid_w(self) -> tuple[float, ...]:
        """The caps the PFI is on (the uncapped one included) [W]."""
        return tuple(float(c) for c in self.cap_w[self.kept])

    def curve(self, period_s: float, name: str = "sweep", interpolation: str = "linear") -> Curves:
        """The job's curve: the monotone fit at every measured cap, joined as
        `interpolation` says (`flexmodel.curves.sweep_curve`)."""
        points = [
            (float(c), float(p), float(t))
            for c, p, t in zip(self.cap_w, self.fit_power_w, self.fit_throughput, strict=True)
        ]
        return sweep_curve(points, period_s=period_s, name=name, interpolation=interpolation)


def fit_sweep(
    points: list[Point] | tuple[Point, ...], *, name: str = "sweep", noise: float = DEFAULT_NOISE
) -> MeasuredSweep:
    """Check, fit and weigh a measured sweep (see the module's docstring); `InvalidSweepError`
    names the sweep and the caps at fault."""
    if not 0.0 <= noise < 1.0:
        raise InvalidSweepError(f"{name}: the noise must be a fraction from 0 to 1, got {noise:g}")
    if len(points) < 2:
        raise InvalidSweepError(
            f"{name}: needs at least two points (a capped and the uncapped run)"
        )
    arr = np.array(sorted(points), dtype=float)
    caps, power, thr = arr[:, 0], arr[:, 1], arr[:, 2]
    same = np.flatnonzero(np.diff(caps) <= 0)
    if same.size:
        raise InvalidSweepError(f"{name}: two points share the cap {caps[same[0]]:g} W")
    if power[-1] <= 0 or thr[-1] <= 0:
        raise InvalidSweepError(f"{name}: the uncapped point needs positive power and throughput")
    fit_power, fit_thr = monotone_fit(power), monotone_fit(thr)
    sigma = _noise([(power, fit_power, power[-1]), (thr, fit_thr, thr[-1])], floor=noise, name=name)
    margin = BINDING_SIGMAS * math.sqrt(2.0) * sigma
    for label, col in (("power_w", power), ("throughput", thr)):
        _refuse_rise(caps, col, margin, label, name, sigma)
    loss = 1.0 - thr / thr[-1]
    # The fit's loss too: Eq. 1 runs on the fit, and must never divide by nothing.
    kept = (loss > max(margin, _LEAST_LOSS)) & (1.0 - fit_thr / fit_thr[-1] > _LEAST_LOSS)
    kept[-1] = True
    aside = tuple(
        SetAside(
            cap_w=float(caps[i]),
            power_w=float(power[i]),
            throughput=float(thr[i]),
            reason=f"throughput {100 * abs(loss[i]):.2g}% {'below' if loss[i] > 0 else 'above'} "
            f"the uncapped run's, within the noise margin of {100 * margin:.2g}%: the cap did "
            "not bind",
        )
        for i in np.flatnonzero(~kept)
    )
    pfi = stderr = measured = None
    if kept.sum() >= 2:
        pfi, stderr = pfi_with_error(fit_power[kept], fit_thr[kept], sigma)
        rows = [(float(c), float(p), float(t)) for c, p, t in arr[kept]]
        measured = pfi_of_sweep(rows, name=name).pfi
    return MeasuredSweep(
        cap_w=caps,
        power_w=power,
        throughput=thr,
        fit_power_w=fit_power,
        fit_throughput=fit_thr,
        kept=kept,
        noise_fraction=sigma,
        set_aside=aside,
        pfi=pfi,
        pfi_stderr=stderr,
        pfi_measured=measured,
    )


def monotone_fit(values: ArrayLike) -> Array:
    """The non-decreasing sequence nearest `values` in least squares (pool adjacent violators)."""
    v = np.asarray(values, dtype=float)
    means: list[float] = []
    sizes: list[int] = []
    for value in v:
        means.append(float(value))
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            size = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / size
            sizes[-2] = size
            means.pop()
            sizes.pop()
    return np.repeat(np.array(means), sizes)


def pfi_with_error(power_w: Array, throughput: Array, noise: float) -> tuple[float, float]:
    """Eq. 1 over points ascending in cap (the last uncapped), and its standard error when each
    power and throughput carries an independent relative error `noise` (first order)."""
    p, t = power_w[:-1], throughput[:-1]
    p_max, t_max = power_w[-1], throughput[-1]
    saved, lost = 1.0 - p / p_max, 1.0 - t / t_max
    n = p.size
    ratio = saved / lost
    # d PFI / d value, each times the value's standard deviation (noise x value).
    d_p = -1.0 / (p_max * lost) * noise * p / n
    d_t = saved / lost**2 / t_max * noise * t / n
    d_p_max = float(np.sum(p / (p_max**2 * lost))) * noise * p_max / n
    d_t_max = -float(np.sum(saved / lost**2 * t / t_max**2)) * noise * t_max / n
    variance = float(np.sum(d_p**2) + np.sum(d_t**2)) + d_p_max**2 + d_t_max**2
    return float(ratio.mean()), math.sqrt(variance)


def _noise(columns: list[tuple[Array, Array, float]], *, floor: float, name: str) -> float:
    """One point's relative noise: the scatter about the monotone fit (its degrees of freedom:
    each pooled run of m points has m - 1), kept within [floor, max(MAX_NOISE, floor)]."""
    squares, freedom = 0.0, 0
    for raw, fit, scale in columns:
        squares += float(np.sum(((raw - fit) / scale) ** 2))
        _, sizes = np.unique(fit, return_counts=True)
        freedom += int(np.sum(sizes - 1))
    scatter = math.sqrt(squares / freedom) if freedom else 0.0
    return min(max(scatter, floor), max(MAX_NOISE, floor))


def _refuse_rise(
    caps: Array, col: Array, margin: float, label: str, name: str, sigma: float
) -> None:
    """Refuse a value that falls, as the cap rises, by more than `margin` of the uncapped one."""
    highest_below = np.maximum.accumulate(col)
    fall = (highest_below - col) > margin * col[-1]
    if fall.any():
        j = int(np.argmax(fall))
        i = int(np.argmax(col[:j] == highest_below[j]))
        raise InvalidSweepError(
            f"{name}: {label} falls from {col[i]:g} to {col[j]:g} as the cap rises from "
            f"{caps[i]:g} W to {caps[j]:g} W, beyond the measurement noise ({100 * sigma:.2g}% "
            "a point); a curve needs it monotone"
        )
