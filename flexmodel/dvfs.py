"""A job's own power-to-clock shape from the SM clock at each probed level (docs/model.md, 1).

Under a power cap the GPU lowers its SM clock (DVFS) until the compute phase draws no more than
the cap. Dynamic power goes as `C V^2 f`, and the voltage a clock needs rises with it, so the
compute phase's power fraction follows

    q(f) = s + (1 - s) * f**a          (s: static share, a: exponent, f: SM clock fraction)

with `a` between 1 (voltage at its floor) and 3 (voltage proportional to clock). `s` and `a`
are the job's own: how much of its power does not scale with the clock (memory, leakage) and how
its voltage-frequency curve is used. A probe measures, at each level, the compute phase's power
and SM clock, each relative to the uncapped references' (`q_i`, `f_i`); the uncapped level is
`(1, 1)` by definition. Two or more capped levels whose clock fell identify `s` and `a`:
`fit_clock_shape` finds them by weighted least squares on `q`, with the clock's error carried
through the curve's slope, and their standard errors from the curvature (scaled up by the
residuals when those exceed the stated noise). Over a probe's range of clocks (about 0.7 to 1)
`s` and `a` trade against each other: many pairs draw nearly the same curve there. A weak prior
centred on the family's shape, as wide as real jobs' shapes spread (`PRIOR_STDERR`), picks
among them; the curve over the probed range is the clock's, and where the levels say little the
estimate stays near the family's, with a standard error that says so.

It falls back to the fleet family's shape (`flexmodel.curves.STATIC_SHARE`, `EXPONENT`), and says
why, when the clock is absent, when fewer than two levels slowed it, or when the fit does not
identify the shape (a bound reached, or errors too large to beat the family's own spread).
Throughput is not used here: it depends on the clock through the job's clock-insensitive share
`m`, which the PFI fit then solves with the shape fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import least_squares

from flexmodel.curves import EXPONENT, STATIC_SHARE

#: Where a fitted shape may lie: a static share below the lowest cap's fraction, an exponent
#: between constant voltage (1) and voltage proportional to clock (3), with room either side.
STATIC_SHARE_BOUNDS = (0.0, 0.6)
EXPONENT_BOUNDS = (0.7, 4.0)
#: A level whose clock is within this fraction of the uncapped clock did not slow it.
SLOWED_FRACTION = 0.99
#: The prior's standard deviations of (static share, exponent) about the family's shape: wider
#: than the workload model's spread of real jobs' shapes (static share 0.08-0.22, exponent
#: 1.3-2.0: standard deviations 0.04 and 0.2), so the levels decide where they can.
PRIOR_STDERR = (0.06, 0.3)
#: The smallest relative error a level's power or clock is taken to have.
NOISE_FLOOR = 1e-3


@dataclass(frozen=True)
class ClockShape:
    static_share: float  #: `s` of q(f)
    exponent: float  #: `a` of q(f)
    static_share_stderr: float | None  #: None for the family's
    exponent_stderr: float | None
    source: str  #: `sm_clock` (fitted) or `family` (the fleet's)
    levels: int  #: capped levels whose clock fell
    reason: str | None = None  #: why the family's, when it is

    def as_doc(self) -> dict[str, float | int | str | None]:
        return {
            "static_share": self.static_share,
            "exponent": self.exponent,
            "static_share_stderr": self.static_share_stderr,
            "exponent_stderr": self.exponent_stderr,
            "source": self.source,
            "levels": self.levels,
            "reason": self.reason,
        }


def family_shape(reason: str, levels: int = 0) -> ClockShape:
    """The fleet family's shape, with why it stands in for the job's."""
    return ClockShape(STATIC_SHARE, EXPONENT, None, None, "family", levels, reason)


def power_fraction(clock_fraction: ArrayLike, static_share: float, exponent: float) -> np.ndarray:
    """`q(f) = s + (1 - s) f^a`."""
    f = np.asarray(clock_fraction, dtype=float)
    return np.asarray(static_share + (1.0 - static_share) * f**exponent, dtype=float)


def fit_clock_shape(
    power_fraction_measured: ArrayLike,
    clock_fraction_measured: ArrayLike,
    *,
    power_noise: ArrayLike = NOISE_FLOOR,
    clock_noise: ArrayLike = NOISE_FLOOR,
) -> ClockShape:
    """The static share and exponent of `q(f)` from capped levels' compute-phase power
    fractions `q_i` and SM clock fractions `f_i` (each relative to the uncapped level's),
    with their relative standard errors; the family's shape, and why, when they do not
    identify it. Levels with a non-finite value are left out."""
    q = np.atleast_1d(np.asarray(power_fraction_measured, dtype=float))
    f = np.atleast_1d(np.asarray(clock_fraction_measured, dtype=float))
    if q.shape != f.shape:
        raise ValueError(f"{q.size} power fractions against {f.size} clock fractions")
    sq = np.maximum(np.broadcast_to(np.asarray(power_noise, dtype=float), q.shape), NOISE_FLOOR)
    sf = np.maximum(np.broadcast_to(np.asarray(clock_noise, dtype=float), q.shape), NOISE_FLOOR)
    known = np.isfinite(q) & np.isfinite(f) & np.isfinite(sq) & np.isfinite(sf)
    if not known.any():
        return family_shape("no SM clock was read at the capped levels")
    slowed = known & (f < SLOWED_FRACTION) & (f > 0.0) & (q > 0.0) & (q < 1.0)
    count = int(slowed.sum())
    if count < 2:
        return family_shape(
            f"{count} capped level(s) slowed the SM clock below {SLOWED_FRACTION:g} of the "
            "uncapped clock: two are needed for a static share and an exponent",
            count,
        )
    found = _clock_fit(q[slowed], f[slowed], sq[slowed], sf[slowed])
    return _fitted_shape(found, count)


def _clock_fit(q: np.ndarray, f: np.ndarray, sq: np.ndarray, sf: np.ndarray) -> Any:
    """`q(f)` fitted to the slowed levels' power fractions `q` at clock fractions `f` (relative
    errors `sq`, `sf`) by least squares, each level weighted by its power's error and its
    clock's carried through the curve's slope, with the prior on the family's shape; scipy's
    result."""

    def sigma(p: np.ndarray) -> np.ndarray:
        slope = (1.0 - p[0]) * p[1] * f ** (p[1] - 1.0)
        return np.asarray(np.hypot(sq * q, slope * sf * f), dtype=float)

    start = np.array([STATIC_SHARE, EXPONENT])
    prior_se = np.array(PRIOR_STDERR)

    def residuals(p: np.ndarray) -> np.ndarray:
        levels = (q - power_fraction(f, p[0], p[1])) / sigma(p)
        return np.asarray(np.concatenate([levels, (p - start) / prior_se]), dtype=float)

    bounds = (
        np.array([STATIC_SHARE_BOUNDS[0], EXPONENT_BOUNDS[0]]),
        np.array([STATIC_SHARE_BOUNDS[1], EXPONENT_BOUNDS[1]]),
    )
    return least_squares(residuals, start, bounds=bounds, x_scale=np.array([0.05, 0.2]))


def _fitted_shape(found: Any, count: int) -> ClockShape:
    """The shape a clock fit (`_clock_fit`'s result on `count` levels) found, with its
    standard errors from the curvature, scaled up by the residuals when those exceed the
    stated noise; the family's, and why, when the fit does not identify it."""
    s, a = (float(v) for v in found.x)
    if not found.success:
        return family_shape(f"the clock fit did not converge: {found.message}", count)
    at_bound = [
        name
        for name, v, (lo, hi) in (
            ("static share", s, STATIC_SHARE_BOUNDS),
            ("exponent", a, EXPONENT_BOUNDS),
        )
        if min(v - lo, hi - v) < 1e-6 * (hi - lo)
    ]
    if at_bound:
        return family_shape(f"the clock fit ran to the bound of its {at_bound[0]}", count)
    jac = found.jac
    try:
        cov = np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return family_shape("the levels' clocks do not separate static share and exponent", count)
    dof = count - 2
    chi2 = float(np.sum(found.fun[:count] ** 2))
    scale = max(chi2 / dof, 1.0) if dof > 0 else 1.0
    s_se, a_se = (math.sqrt(max(float(v), 0.0) * scale) for v in np.diag(cov))
    return ClockShape(s, a, s_se, a_se, "sm_clock", count)
