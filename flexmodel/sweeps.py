"""Measured sweeps read with their noise: the one rule `flexgate pfi` and job mixes share.

A sweep is points `(cap_w, power_w, throughput)`, the highest cap the uncapped run
(docs/model.md, sections 1 and 2). `fit_sweep`:

1. checks the points: two or more, distinct caps, positive uncapped power and throughput;
2. takes as repeats of the uncapped run the caps that did not bind (power clearly below the cap
   and not below the uncapped run's beyond the noise): their mean is the reference, their
   spread the sweep's own noise;
3. fits power and throughput monotone in the cap (isotonic: pool adjacent violators), and takes
   each column's noise (one point's standard deviation, relative) from the repeats' spread and
   the scatter about that fit (the latter at most `max(MAX_NOISE, floor)`), at least the floor;
4. refuses a sweep only where its trend is no sweep: power or throughput rising as the cap falls
   beyond what that noise (and, from few repeats, its own uncertainty) could do;
5. sets aside, and reports, the repeats and the capped points whose throughput is within the
   noise margin of the reference: the cap did not bind beyond the noise, and Eq. 1, which
   divides by the throughput lost, is undefined or meaningless there;
6. gives the PFI (Eq. 1 on the fit at the kept caps) with its standard error (first-order
   propagation of the noise), and Eq. 1 on the kept points as measured, for comparison with
   the study's values. The PFI is on the kept caps' grid (`grid_w`): nothing is extrapolated.

docs/model.md, "Measured sweeps and their noise", has the formulas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import t as student_t

from flexmodel.curves import Array, Curves, sweep_curve
from flexmodel.errors import InvalidSweepError
from flexmodel.pfi import pfi_of_sweep

#: One point's throughput and mean power noise when nothing says otherwise: 0.5% (relative).
DEFAULT_NOISE = 0.005
#: Scatter above this is not noise: a sweep departing further from monotone is refused.
MAX_NOISE = 0.02
#: Runs of one level that scatter beyond this are no sweep (a point's relative deviation).
MAX_REPEAT_NOISE = 0.2
#: A cap binds when it lowers throughput by more than this many standard deviations of the
#: difference of two points (each with the noise): about 1.4% at the default noise.
BINDING_SIGMAS = 2.0
#: Even without noise, a cap binds only where it lowered throughput by more than this.
_LEAST_LOSS = 1e-9

Point = tuple[float, float, float]
BoolArray = NDArray[np.bool_]
IndexArray = NDArray[np.intp]


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
    power_noise_fraction: float = 0.0  #: one point's relative power noise
    throughput_noise_fraction: float = 0.0  #: one point's relative throughput noise
    repeats: int = 1  #: runs of the uncapped level (the uncapped one and caps that did not bind)
    out_of_order: tuple[SetAside, ...] = ()  #: kept points pooled in the monotone fit

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
    points: list[Point] | tuple[Point, ...],
    *,
    name: str = "sweep",
    noise: float = DEFAULT_NOISE,
    power_noise: float | None = None,
) -> MeasuredSweep:
    """Check, fit and weigh a measured sweep (see the module's docstring); `InvalidSweepError`
    names the sweep and the caps at fault. `noise` is the floor of one point's relative noise,
    `power_noise` that of its power where it differs (a probe measures mean power better than
    throughput)."""
    arr, noise_p = _checked_points(points, name, noise, power_noise)
    caps, power, thr = arr[:, 0], arr[:, 1], arr[:, 2]
    repeat = _repeats(caps, power, noise_p)
    n_ref = int(repeat.sum())
    fit = _MonotoneFit.of(power, thr, repeat, n_ref)
    sigma_p = _noise(power, fit.power_w, repeat, fit.ref_power_w, floor=noise_p, name=name)
    sigma_t = _noise(thr, fit.throughput, repeat, fit.ref_throughput, floor=noise, name=name)
    _refuse_trends(arr, fit, sigma_p, sigma_t, n_ref, name)
    margin_t = _binding_margin(sigma_t, n_ref)
    loss = 1.0 - thr / fit.ref_throughput
    # The fit's loss too: Eq. 1 runs on the fit, and must never divide by nothing.
    kept = (loss > max(margin_t, _LEAST_LOSS)) & (
        1.0 - fit.throughput / fit.throughput[-1] > _LEAST_LOSS
    )
    kept &= ~repeat
    kept[-1] = True
    pfi = stderr = measured = None
    if kept.sum() >= 2:
        pfi, stderr = pfi_with_error(
            fit.power_w[kept],
            fit.throughput[kept],
            sigma_p,
            throughput_noise=sigma_t,
            reference_repeats=n_ref,
        )
        rows = [(float(c), float(p), float(t)) for c, p, t in arr[kept]]
        measured = pfi_of_sweep(rows, name=name).pfi
    return MeasuredSweep(
        cap_w=caps,
        power_w=power,
        throughput=thr,
        fit_power_w=fit.power_w,
        fit_throughput=fit.throughput,
        kept=kept,
        noise_fraction=max(sigma_p, sigma_t),
        set_aside=_set_aside(arr, kept, repeat, loss, margin_t),
        pfi=pfi,
        pfi_stderr=stderr,
        pfi_measured=measured,
        power_noise_fraction=sigma_p,
        throughput_noise_fraction=sigma_t,
        repeats=n_ref,
        out_of_order=fit.out_of_order(arr, kept),
    )


def _checked_points(
    points: list[Point] | tuple[Point, ...], name: str, noise: float, power_noise: float | None
) -> tuple[Array, float]:
    """The points as rows ascending in cap, and the floor of a point's power noise."""
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
    noise_p = noise if power_noise is None else power_noise
    if not 0.0 <= noise_p < 1.0:
        raise InvalidSweepError(
            f"{name}: the noise must be a fraction from 0 to 1, got {noise_p:g}"
        )
    return arr, noise_p


@dataclass(frozen=True)
class _MonotoneFit:
    """Power and throughput fitted monotone in the cap: the points whose cap bound, and the
    repeats as one reference run weighted by their count."""

    bound: IndexArray  #: the points whose cap bound
    ref_power_w: float  #: the repeats' mean power [W]
    ref_throughput: float  #: the repeats' mean throughput
    bound_power_w: Array  #: the fit of the bound points' power, the reference's last [W]
    bound_throughput: Array  #: the same for throughput
    power_w: Array  #: the fitted power at every cap [W]
    throughput: Array  #: the fitted throughput at every cap

    @classmethod
    def of(cls, power: Array, thr: Array, repeat: BoolArray, n_ref: int) -> _MonotoneFit:
        # The repeats are one level measured n_ref times: their mean is the reference, their
        # spread about it the sweep's own noise (measured, so never capped at MAX_NOISE).
        ref_power, ref_thr = float(power[repeat].mean()), float(thr[repeat].mean())
        bound = np.flatnonzero(~repeat)
        weights = np.append(np.ones(bound.size), float(n_ref))
        fit_power = np.full(power.size, ref_power)
        fit_thr = np.full(power.size, ref_thr)
        fp = monotone_fit(np.append(power[bound], ref_power), weights)
        ft = monotone_fit(np.append(thr[bound], ref_thr), weights)
        fit_power[bound], fit_thr[bound] = fp[:-1], ft[:-1]
        fit_power[repeat], fit_thr[repeat] = fp[-1], ft[-1]
        return cls(bound, ref_power, ref_thr, fp, ft, fit_power, fit_thr)

    def out_of_order(self, arr: Array, kept: BoolArray) -> tuple[SetAside, ...]:
        """The kept points that the fit pooled with a neighbour (rows of `arr` as the sweep's)."""
        return tuple(
            SetAside(
                cap_w=float(arr[i, 0]),
                power_w=float(arr[i, 1]),
                throughput=float(arr[i, 2]),
                reason="out of order within the noise: pooled with its neighbours in the "
                "monotone fit",
            )
            for i in self.bound
            if kept[i]
            and (
                _pooled(self.bound_power_w, self.bound, int(i))
                or _pooled(self.bound_throughput, self.bound, int(i))
            )
        )


def _binding_margin(sigma: float, n_ref: int) -> float:
    """Two standard deviations of a point's difference from the (pooled) reference."""
    return BINDING_SIGMAS * sigma * math.sqrt(1.0 + 1.0 / n_ref)


def _refuse_trends(
    arr: Array, fit: _MonotoneFit, sigma_p: float, sigma_t: float, n_ref: int, name: str
) -> None:
    """Refuse power or throughput rising as the cap falls beyond what the noise could do, its
    own uncertainty included: with the noise measured from a few repeats, Student's t for
    their degrees of freedom, not 2."""
    refuse_p, refuse_t = _binding_margin(sigma_p, n_ref), _binding_margin(sigma_t, n_ref)
    if n_ref > 1:
        t_ratio = float(student_t.ppf(0.975, n_ref - 1)) / BINDING_SIGMAS
        refuse_p, refuse_t = refuse_p * t_ratio, refuse_t * t_ratio
    bound = fit.bound
    caps = np.append(arr[bound, 0], arr[-1, 0])
    power = np.append(arr[bound, 1], fit.ref_power_w)
    _refuse_rise(caps, power, refuse_p, "power_w", name, sigma_p)
    thr = np.append(arr[bound, 2], fit.ref_throughput)
    _refuse_rise(caps, thr, refuse_t, "throughput", name, sigma_t)


def _set_aside(
    arr: Array, kept: BoolArray, repeat: BoolArray, loss: Array, margin_t: float
) -> tuple[SetAside, ...]:
    """The points left out of the PFI, each with why: the repeats of the uncapped run and the
    caps whose throughput `loss` (against the reference) is within the noise margin."""
    caps, power, thr = arr[:, 0], arr[:, 1], arr[:, 2]
    n_ref = int(repeat.sum())
    raw_loss = 1.0 - thr / thr[-1]
    reference = "the uncapped run's" if n_ref == 1 else f"the mean of the {n_ref} runs no cap bound"
    return tuple(
        SetAside(
            cap_w=float(caps[i]),
            power_w=float(power[i]),
            throughput=float(thr[i]),
            reason=(
                f"a repeat of the uncapped run (power {power[i]:.4g} W, below the cap and not "
                f"below the uncapped {power[-1]:.4g} W beyond the noise): the cap did not bind; "
                if repeat[i]
                else ""
            )
            + (
                f"throughput {100 * abs(raw_loss[i]):.2g}% "
                f"{'below' if raw_loss[i] > 0 else 'above'} the uncapped run's"
                if repeat[i]
                else f"throughput {100 * abs(loss[i]):.2g}% "
                f"{'below' if loss[i] > 0 else 'above'} {reference}, within the noise margin "
                f"of {100 * margin_t:.2g}%: the cap did not bind"
            ),
        )
        for i in np.flatnonzero(~kept)
    )


def _repeats(caps: Array, power: Array, floor: float) -> BoolArray:
    """Caps that did not bind: the uncapped run and every capped run whose power is clearly
    below its cap and not below the uncapped run's beyond the noise (a cap only lowers power,
    so the test is one-sided: `BINDING_SIGMAS` standard deviations of the difference of two
    points)."""
    tol = BINDING_SIGMAS * math.sqrt(2.0) * floor
    repeat: BoolArray = (power < caps * (1.0 - tol)) & (power >= power[-1] * (1.0 - tol))
    repeat[-1] = True
    return repeat


def _pooled(fit: Array, bound: IndexArray, i: int) -> bool:
    """Whether bound point `i` shares its fitted value with a neighbour (a pooled violator)."""
    j = int(np.flatnonzero(bound == i)[0])
    return bool((j > 0 and fit[j - 1] == fit[j]) or (j + 1 < fit.size and fit[j + 1] == fit[j]))


def monotone_fit(values: ArrayLike, weights: ArrayLike | None = None) -> Array:
    """The non-decreasing sequence nearest `values` in (weighted) least squares (pool adjacent
    violators)."""
    v = np.asarray(values, dtype=float)
    w = np.ones(v.size) if weights is None else np.asarray(weights, dtype=float)
    means: list[float] = []
    mass: list[float] = []
    sizes: list[int] = []
    for value, weight in zip(v, w, strict=True):
        means.append(float(value))
        mass.append(float(weight))
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            total = mass[-2] + mass[-1]
            means[-2] = (means[-2] * mass[-2] + means[-1] * mass[-1]) / total
            mass[-2] = total
            sizes[-2] += sizes[-1]
            means.pop()
            mass.pop()
            sizes.pop()
    fitted: Array = np.repeat(np.array(means), sizes)
    return fitted


def pfi_with_error(
    power_w: Array,
    throughput: Array,
    noise: float,
    *,
    throughput_noise: float | None = None,
    reference_repeats: int = 1,
) -> tuple[float, float]:
    """Eq. 1 over points ascending in cap (the last uncapped), and its standard error when each
    power carries an independent relative error `noise` and each throughput
    `throughput_noise` (`noise` if not given), the uncapped values being the mean of
    `reference_repeats` runs (first order)."""
    noise_t = noise if throughput_noise is None else throughput_noise
    ref_scale = 1.0 / math.sqrt(reference_repeats)
    p, t = power_w[:-1], throughput[:-1]
    p_max, t_max = power_w[-1], throughput[-1]
    saved, lost = 1.0 - p / p_max, 1.0 - t / t_max
    n = p.size
    ratio = saved / lost
    # d PFI / d value, each times the value's standard deviation (noise x value).
    d_p = -1.0 / (p_max * lost) * noise * p / n
    d_t = saved / lost**2 / t_max * noise_t * t / n
    d_p_max = float(np.sum(p / (p_max**2 * lost))) * noise * ref_scale * p_max / n
    d_t_max = -float(np.sum(saved / lost**2 * t / t_max**2)) * noise_t * ref_scale * t_max / n
    variance = float(np.sum(d_p**2) + np.sum(d_t**2)) + d_p_max**2 + d_t_max**2
    return float(ratio.mean()), math.sqrt(variance)


def _noise(
    col: Array, fit: Array, repeat: BoolArray, ref: float, *, floor: float, name: str
) -> float:
    """One point's relative noise in one column: the repeats' spread about their mean
    (`n - 1` degrees of freedom; measured, so not capped at MAX_NOISE) pooled with the bound
    points' scatter about the monotone fit (each pooled run of m points gives m - 1; capped at
    `max(MAX_NOISE, floor)`: scatter beyond that is no noise), at least `floor`."""
    rep = col[repeat]
    ss_rep = float(np.sum(((rep - ref) / ref) ** 2))
    dof_rep = rep.size - 1
    if dof_rep and math.sqrt(ss_rep / dof_rep) > MAX_REPEAT_NOISE:
        raise InvalidSweepError(
            f"{name}: the runs whose cap did not bind scatter by "
            f"{100 * math.sqrt(ss_rep / dof_rep):.2g}% (beyond {100 * MAX_REPEAT_NOISE:.2g}%): "
            "no sweep"
        )
    bound = ~repeat
    ss_b = float(np.sum(((col[bound] - fit[bound]) / ref) ** 2))
    _, sizes = np.unique(np.append(fit[bound], fit[-1]), return_counts=True)
    dof_b = int(np.sum(sizes - 1))
    if dof_b:
        s_b = min(math.sqrt(ss_b / dof_b), max(MAX_NOISE, floor))
        ss_b = s_b**2 * dof_b
    freedom = dof_rep + dof_b
    scatter = math.sqrt((ss_rep + ss_b) / freedom) if freedom else 0.0
    return max(scatter, floor)


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
