"""Power-throughput curves of training jobs (docs/model.md, section 1).

A job's curve maps a per-GPU power cap to the job's mean power per GPU and its throughput.
Every curve, whatever its source, is held as a table of points ascending in cap, and every
consumer (allocation, quotes, simulated GPUs) reads it through `operating_point` and
`cap_for_power`, which interpolate linearly between the points and never extrapolate. A
sweep's few points may first be joined by a monotone cubic (`interpolation="pchip"`,
tabulated densely), which follows a concave curve where straight lines cut under it.

Sources, best first: a measured sweep (its own points), a PFI turned into a curve of the fleet
family (`family_curves`), and the fleet default PFI.

The fleet family describes the compute phase of a two-level power waveform: the job computes
for a share `duty` of each iteration at `compute_w` and communicates for the rest at
`comm_w`. A cap `c` clips the compute level; the SM clock fraction `f` follows from the power
fraction `q = min(c, compute_w) / compute_w`

    q(f) = s + (1 - s) * f**a          (s: static share, a: exponent)
    y(f) = 1 / (m + (1 - m) / f)       (m: clock-insensitive share of compute)

and the compute phase takes `1/y` times longer. Communication is not slowed; its level is
clipped too when the cap falls below it. So mean power under a cap is below the cap, and the
iteration period stretches by `duty / y + (1 - duty)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.interpolate import PchipInterpolator

from flexmodel.errors import InvalidSweepError

Array = NDArray[np.float64]

#: Fleet family shape, calibrated against the PFI study's H200 table (docs/model.md).
STATIC_SHARE = 0.15
EXPONENT = 1.6
#: Bounds of the clock-insensitive share when solving it from a PFI.
INSENSITIVE_SHARE_RANGE = (-4.0, 0.97)
#: Caps tabulated per family curve, on top of the two kinks (compute and comm levels).
FAMILY_POINTS = 22
#: The SM clock never falls below this fraction, whatever the cap.
MIN_CLOCK_FRACTION = 0.02
#: Caps closer than this are one [W].
CAP_RESOLUTION_W = 0.5


@dataclass(frozen=True)
class Curves:
    """Curves of J jobs, each tabulated at K points ascending in cap.

    Shorter tables are padded at the low end by repeating their lowest point.
    """

    cap_w: Array  #: (J, K) per-GPU cap [W]
    power_w: Array  #: (J, K) mean power per GPU under that cap [W]
    throughput: Array  #: (J, K) whole-job throughput under that cap [tokens/s]
    period_s: Array  #: (J,) uncapped iteration period [s]

    @property
    def uncapped_power_w(self) -> Array:
        return self.power_w[:, -1]

    @property
    def uncapped_throughput(self) -> Array:
        return self.throughput[:, -1]

    def __len__(self) -> int:
        return int(self.cap_w.shape[0])

    def select(self, index: slice | NDArray[np.intp] | NDArray[np.bool_]) -> Curves:
        """The curves of the jobs picked by `index`."""
        return Curves(
            cap_w=self.cap_w[index],
            power_w=self.power_w[index],
            throughput=self.throughput[index],
            period_s=self.period_s[index],
        )


def waveform_levels(
    power_w: ArrayLike, duty: ArrayLike, comm_power_fraction: ArrayLike, max_cap_w: ArrayLike
) -> tuple[Array, Array]:
    """Compute- and communication-phase power levels [W] for a mean uncapped power [W].

    The compute level is `power_w / (duty + (1 - duty) * comm_power_fraction)`, but a GPU never
    draws above its limit: when the stated waveform implies more, the compute level is
    `max_cap_w` and the communication level takes the rest of the mean.
    """
    p = np.asarray(power_w, dtype=float)
    d = np.asarray(duty, dtype=float)
    rho = np.asarray(comm_power_fraction, dtype=float)
    compute = np.minimum(p / (d + (1.0 - d) * rho), np.asarray(max_cap_w, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        # Near duty 1 the communication phase is too short to carry a level of its own.
        comm = np.where(d < 1.0 - 1e-9, (p - d * compute) / (1.0 - d), compute * rho)
    return compute, np.minimum(comm, compute)


def clock_fraction(
    power_fraction: ArrayLike, static_share: ArrayLike, exponent: ArrayLike
) -> Array:
    """SM clock fraction `f` at a compute-phase power fraction `q` (inverse of q(f))."""
    q = np.asarray(power_fraction, dtype=float)
    s = np.asarray(static_share, dtype=float)
    base = np.clip((q - s) / (1.0 - s), 0.0, 1.0)
    f = base ** (1.0 / np.asarray(exponent, dtype=float))
    return np.asarray(np.maximum(f, MIN_CLOCK_FRACTION), dtype=float)


def throughput_fraction(clock: ArrayLike, insensitive_share: ArrayLike) -> Array:
    """Compute-phase throughput fraction `y(f) = 1 / (m + (1 - m) / f)`."""
    m = np.asarray(insensitive_share, dtype=float)
    return np.asarray(1.0 / (m + (1.0 - m) / np.asarray(clock, dtype=float)), dtype=float)


@dataclass(frozen=True)
class FamilyShape:
    """The fleet family's view of J jobs: their two-level waveform, cap range and clock model.

    Everything a family curve needs except the clock-insensitive share `m` (solved from each
    job's PFI) and its scale (uncapped throughput, iteration period). Arrays of shape (J,);
    build one from each job's mean uncapped power with `FamilyShape.of`.
    """

    compute_w: Array  #: compute-phase power level [W]
    comm_w: Array  #: communication-phase power level [W]
    duty: Array  #: share of each iteration spent computing
    min_cap_w: Array  #: lowest cap the curve is tabulated at [W]
    max_cap_w: Array  #: the GPU's limit: the uncapped end of the curve [W]
    static_share: Array  #: `s` of q(f)
    exponent: Array  #: `a` of q(f)

    @classmethod
    def of(
        cls,
        *,
        power_w: ArrayLike,
        duty: ArrayLike,
        comm_power_fraction: ArrayLike,
        min_cap_w: ArrayLike,
        max_cap_w: ArrayLike,
        static_share: ArrayLike = STATIC_SHARE,
        exponent: ArrayLike = EXPONENT,
    ) -> FamilyShape:
        """The shape of jobs of mean uncapped power `power_w` [W] (all arguments broadcast)."""
        p, d, rho, lo, hi, s, a = np.broadcast_arrays(
            *(
                np.atleast_1d(np.asarray(v, dtype=float))
                for v in (
                    power_w,
                    duty,
                    comm_power_fraction,
                    min_cap_w,
                    max_cap_w,
                    static_share,
                    exponent,
                )
            )
        )
        compute, comm = waveform_levels(p, d, rho, hi)
        # Copies: broadcast views are read-only and share memory between jobs.
        return cls(
            compute_w=compute,
            comm_w=comm,
            duty=d.copy(),
            min_cap_w=lo.copy(),
            max_cap_w=hi.copy(),
            static_share=s.copy(),
            exponent=a.copy(),
        )

    def __len__(self) -> int:
        return int(self.compute_w.shape[0])

    def select(self, index: slice | NDArray[np.intp]) -> FamilyShape:
        """The shape of the jobs picked by `index`."""
        return FamilyShape(
            compute_w=self.compute_w[index],
            comm_w=self.comm_w[index],
            duty=self.duty[index],
            min_cap_w=self.min_cap_w[index],
            max_cap_w=self.max_cap_w[index],
            static_share=self.static_share[index],
            exponent=self.exponent[index],
        )


def family_point(
    cap_w: ArrayLike, shape: FamilyShape, insensitive_share: ArrayLike
) -> tuple[Array, Array]:
    """Mean power [W] and throughput fraction of family jobs under per-GPU caps [W].

    Row j of `cap_w` (J, K) holds caps for job j of `shape`; `insensitive_share` has one value
    per job. The throughput fraction is also the inverse of the iteration period's stretch.
    """
    cap = np.asarray(cap_w, dtype=float)
    compute = shape.compute_w[:, None]
    d = shape.duty[:, None]
    compute_level = np.minimum(cap, compute)
    f = clock_fraction(
        compute_level / compute, shape.static_share[:, None], shape.exponent[:, None]
    )
    m = np.asarray(insensitive_share, dtype=float).reshape(-1, 1)
    # An unclipped compute phase runs at full clock whatever the family says at q = 1.
    y = np.where(cap >= compute, 1.0, throughput_fraction(f, m))
    stretch = d / y + (1.0 - d)
    mean = (compute_level * d / y + np.minimum(cap, shape.comm_w[:, None]) * (1.0 - d)) / stretch
    return mean, 1.0 / stretch


def family_curves(
    shape: FamilyShape,
    insensitive_share: ArrayLike,
    *,
    throughput: ArrayLike,
    period_s: ArrayLike,
) -> Curves:
    """Tabulate the fleet-family curves of the jobs of `shape`.

    `insensitive_share`, the uncapped whole-job `throughput` [tokens/s] and iteration
    `period_s` [s] broadcast to one value per job.
    """
    j = len(shape)
    m, x, t = (
        np.broadcast_to(np.asarray(v, dtype=float), (j,))
        for v in (insensitive_share, throughput, period_s)
    )
    lo, hi = shape.min_cap_w[:, None], shape.max_cap_w[:, None]
    grid = lo + (hi - lo) * np.linspace(0.0, 1.0, FAMILY_POINTS)
    kinks = np.clip(np.stack([shape.compute_w, shape.comm_w], axis=1), lo, hi)
    caps = np.sort(np.concatenate([grid, kinks], axis=1), axis=1)
    mean, frac = family_point(caps, shape, m)
    return Curves(cap_w=caps, power_w=mean, throughput=frac * x[:, None], period_s=t.copy())


def sweep_curve(
    points: list[tuple[float, float, float]],
    *,
    period_s: float,
    name: str = "sweep",
    interpolation: str = "linear",
) -> Curves:
    """One measured sweep `(cap_w, power_w, throughput)` as a curve (uncapped = highest cap).

    Power and throughput must not fall as the cap rises. Between the points the curve is
    joined by straight lines (`linear`) or, with `pchip`, by the monotone piecewise cubic of
    Fritsch and Carlson through the same points (docs/model.md, section 1), tabulated at
    `FAMILY_POINTS` caps besides the measured ones: both keep it monotone and pass through
    every point, and neither goes past the measured caps.
    """
    if len(points) < 2:
        raise InvalidSweepError(
            f"{name}: needs at least two points (a capped and the uncapped run)"
        )
    arr = np.array(sorted(points), dtype=float)
    caps, power, thr = arr[:, 0], arr[:, 1], arr[:, 2]
    if np.any(np.diff(caps) <= 0):
        raise InvalidSweepError(
            f"{name}: two points share the cap {caps[np.argmin(np.diff(caps))]:g} W"
        )
    for label, col in (("power_w", power), ("throughput", thr)):
        fall = np.flatnonzero(np.diff(col) < 0)
        if fall.size:
            i = fall[0]
            raise InvalidSweepError(
                f"{name}: {label} falls from {col[i]:g} to {col[i + 1]:g} as the cap rises "
                f"from {caps[i]:g} W to {caps[i + 1]:g} W; a curve needs it monotone"
            )
    if interpolation == "pchip" and caps.size > 2:
        grid = np.linspace(caps[0], caps[-1], FAMILY_POINTS)
        apart = np.min(np.abs(grid[:, None] - caps[None, :]), axis=1) > CAP_RESOLUTION_W
        dense = np.sort(np.concatenate([caps, grid[apart]]))
        # between the points, mean power stays at or below its cap (or the straight line)
        ceiling = np.maximum(dense, np.interp(dense, caps, power))
        power = np.minimum(PchipInterpolator(caps, power)(dense), ceiling)
        thr = PchipInterpolator(caps, thr)(dense)
        caps = dense
    return Curves(
        cap_w=caps[None, :],
        power_w=power[None, :],
        throughput=thr[None, :],
        period_s=np.array([period_s], dtype=float),
    )


def extend_below(measured: Curves, family: Curves) -> Curves:
    """One measured curve (one row) continued below its lowest cap by a family curve of the
    same job.

    Below the lowest measured cap the measurement says nothing; the family (the next source,
    a PFI turned into a curve) does. Its points below that cap are scaled so that they meet
    the lowest measured point (power and throughput each by their ratio there), which keeps
    the curve continuous and monotone; mean power stays at or below its cap. Within the
    measured range the curve is the measurement's, unchanged.
    """
    low_cap, low_power, low_thr = (
        float(a[0, 0]) for a in (measured.cap_w, measured.power_w, measured.throughput)
    )
    fam_power, fam_thr, _ = operating_point(family, low_cap)
    ratios = (low_power / float(fam_power[0]), low_thr / float(fam_thr[0]))
    below = family.cap_w[0] < low_cap - CAP_RESOLUTION_W
    if not below.any() or not all(np.isfinite(r) and r > 0 for r in ratios):
        return measured
    caps = family.cap_w[0, below]
    power = np.minimum(np.minimum(family.power_w[0, below] * ratios[0], caps), low_power)
    thr = np.minimum(family.throughput[0, below] * ratios[1], low_thr)
    return Curves(
        cap_w=np.concatenate([caps, measured.cap_w[0]])[None, :],
        power_w=np.concatenate([power, measured.power_w[0]])[None, :],
        throughput=np.concatenate([thr, measured.throughput[0]])[None, :],
        period_s=measured.period_s.copy(),
    )


def stack(curves: list[Curves]) -> Curves:
    """Stack curves into one table, padding shorter ones at their low end."""
    width = max(c.cap_w.shape[1] for c in curves)

    def pad(a: Array) -> Array:
        return np.concatenate([np.repeat(a[:, :1], width - a.shape[1], axis=1), a], axis=1)

    return Curves(
        cap_w=np.concatenate([pad(c.cap_w) for c in curves]),
        power_w=np.concatenate([pad(c.power_w) for c in curves]),
        throughput=np.concatenate([pad(c.throughput) for c in curves]),
        period_s=np.concatenate([c.period_s for c in curves]),
    )


def interp_rows(xp: Array, fp: Array, x: ArrayLike) -> Array:
    """Row-wise linear interpolation: `fp[j]` at `x[j]` on the non-decreasing row `xp[j]`.

    `x` is clipped to each row's range (no extrapolation). Where several points share `x`, the
    last (highest-cap) one wins.
    """
    # np.minimum/np.maximum rather than np.clip: this runs in the inner loop of simulations,
    # where np.clip's Python-level overhead costs more than the arithmetic.
    at = np.minimum(np.maximum(np.asarray(x, dtype=float), xp[:, 0]), xp[:, -1])
    k = xp.shape[1]
    i = np.minimum((xp <= at[:, None]).sum(axis=1) - 1, k - 2)
    rows = np.arange(xp.shape[0])
    x0, x1 = xp[rows, i], xp[rows, i + 1]
    f0, f1 = fp[rows, i], fp[rows, i + 1]
    span = x1 - x0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(span > 0, (at - x0) / span, 1.0)
    return np.asarray(f0 + np.minimum(np.maximum(t, 0.0), 1.0) * (f1 - f0), dtype=float)


def operating_point(curves: Curves, cap_w: ArrayLike) -> tuple[Array, Array, Array]:
    """Mean power per GPU [W], throughput [tokens/s] and iteration period [s] under caps [W].

    A cap above the highest tabulated cap leaves the job uncapped; one below the lowest
    behaves as the lowest (the GPU refuses lower limits).
    """
    cap = np.broadcast_to(np.asarray(cap_w, dtype=float), (len(curves),))
    power = interp_rows(curves.cap_w, curves.power_w, cap)
    thr = interp_rows(curves.cap_w, curves.throughput, cap)
    with np.errstate(divide="ignore"):
        period = curves.period_s * curves.uncapped_throughput / thr
    return power, thr, period


def cap_for_power(curves: Curves, power_w: ArrayLike) -> Array:
    """The cap [W] under which each job's mean power is `power_w` (the highest such cap)."""
    p = np.broadcast_to(np.asarray(power_w, dtype=float), (len(curves),))
    return interp_rows(curves.power_w, curves.cap_w, p)


def throughput_at_power(curves: Curves, power_w: ArrayLike) -> Array:
    """Throughput [tokens/s] at a mean power per GPU [W] (the curve seen in power)."""
    p = np.broadcast_to(np.asarray(power_w, dtype=float), (len(curves),))
    return interp_rows(curves.power_w, curves.throughput, p)


def power_for_throughput(curves: Curves, throughput: ArrayLike) -> Array:
    """The lowest mean power per GPU [W] at which each job still makes `throughput`."""
    x = np.broadcast_to(np.asarray(throughput, dtype=float), (len(curves),))
    # Interpolate power against throughput, taking the lowest-power point among ties.
    rev_x = -curves.throughput[:, ::-1]
    rev_p = curves.power_w[:, ::-1]
    return interp_rows(rev_x, rev_p, -x)
