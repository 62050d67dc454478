"""Will a control loop make training jobs phase-lock? (MODEL.md section 8)

A job's power alternates between a compute level (share `duty` of each iteration of period
`T`) and a communication level. A loop that throttles jobs from a delayed, windowed reading of
shared power couples them; per harmonic `m` of the waveform its effective attraction is

    a_m = -K_m * F_m * sin(m * w * (tau + W/2))      w = 2*pi/T, K_m = K * |c_m|^2 / |c_1|^2

with `|c_m|^2 = sin(pi*m*d)^2 / (pi*m)^2` the waveform's harmonic power, `F_m = sin(x)/x`,
`x = m*w*W/2`, the moving average's signed gain, and `K` (`gain_per_s`) the coupling strength
at the fundamental. Positive `a_m` attracts: the jobs drift into step on that harmonic.

- A harmonic is **significant** when `|c_m|^2 |F_m| >= 0.1 |c_1|^2` (m = 1..5).
- **Critical coupling** for a Lorentzian rate spread of half-width `gamma = spread * w`
  (Ott-Antonsen, MODEL.md section 8): harmonic `m` locks when
  `a_m > 2 * gamma * exp(m * gamma * tau_eff)`. In the variable `m * phi` both the rate spread
  and the coupling scale by `m`, so the threshold on `a_m` is the fundamental's `2 gamma`; only
  the lag factor grows with `m`. The exponential is the order-of-magnitude decoherence a delay
  adds across a spread population; at `gamma*tau << 1` the threshold is linear in the spread.
- **Verdict**: `safe` when no significant harmonic attracts; `unsafe` when one attracts beyond
  its critical coupling (with no spread, any attraction); `at-risk` when one attracts below it
  (locking can still be held by hysteresis once it happened).
- **Exact two-job criterion** over all harmonics: in phase is stable iff
  `S = sum_m m |c_m|^2 F_m sin(m w tau_eff) < 0`. `sum_m m |c_m|^2 sin(m theta)` is minus half
  the derivative of the pulse's autocorrelation, a step function of `theta mod 2*pi`:
  `+1/(4 pi)` below `2 pi d`, `-1/(4 pi)` above `2 pi (1 - d)`, both where they overlap. The
  window averages it over delays `[tau, tau + W]`. So `S` is exact, and the neutral band
  (`d' T < tau < (1 - d') T`, `d' = min(d, 1 - d)`) comes out exactly 0: neutral, not stable.

Everything is vectorised over jobs (arrays of periods and duties).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError

HARMONICS = np.arange(1, 6)
SIGNIFICANT_SHARE = 0.1
#: Default coupling strength at the fundamental [rad/s]: a site loop that moves a job's
#: iteration rate by ~1% of a 2 s job's 3.1 rad/s at full aggregate swing.
DEFAULT_GAIN_PER_S = 0.05
VERDICTS = ("safe", "at-risk", "unsafe")
_ZERO = 1e-12
Mask = NDArray[np.bool_]


#: The shortest compute share analysed: below it |c_1|^2 underflows and the coupling is 0/0.
MIN_DUTY = 1e-6


def harmonic_power(m: ArrayLike, duty: ArrayLike) -> Array:
    """`|c_m|^2` of a two-level waveform with compute share `duty`."""
    m = np.asarray(m, dtype=float)
    return np.asarray(np.sin(np.pi * m * np.asarray(duty)) ** 2 / (np.pi * m) ** 2, dtype=float)


def critical_coupling_per_s(m: ArrayLike, gamma_per_s: ArrayLike, tau_eff_s: float) -> Array:
    """The attraction [rad/s] at which harmonic `m` locks a Lorentzian population of rate
    half-width `gamma_per_s` behind an effective delay `tau_eff_s` (MODEL.md section 8:
    `2 gamma exp(m gamma tau)`; the spread and the coupling both scale by m in `m * phi`)."""
    gamma = np.asarray(gamma_per_s, dtype=float)
    return np.asarray(2.0 * gamma * np.exp(np.asarray(m) * gamma * tau_eff_s), dtype=float)


def window_gain(m: ArrayLike, period_s: ArrayLike, window_s: ArrayLike) -> Array:
    """`F_m`: the signed gain of a moving average over `window_s` at harmonic `m`."""
    x = np.asarray(m) * np.pi * np.asarray(window_s) / np.asarray(period_s)  # m * w * W / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(np.abs(x) < 1e-12, 1.0, np.sin(x) / x), dtype=float)


@dataclass(frozen=True)
class Analysis:
    """The coupling of one loop on J jobs; arrays are (J, 5) per harmonic or (J,)."""

    period_s: Array
    duty: Array
    delay_s: float
    window_s: float
    spread: float
    gain_per_s: float
    weight: Array  #: |c_m|^2 * F_m
    significant: Mask
    coupling_per_s: Array  #: a_m, positive = attractive
    critical_per_s: Array  #: the attraction at which harmonic m locks, for the spread
    in_phase_sum: Array  #: S of the exact two-job criterion
    max_safe_delay_s: Array

    @property
    def attractive(self) -> Mask:
        return np.asarray(self.coupling_per_s > _ZERO * self.gain_per_s, dtype=bool)

    @property
    def verdict(self) -> list[str]:
        attract = self.attractive & self.significant
        locks = attract & (self.coupling_per_s > self.critical_per_s)
        out = np.where(locks.any(axis=1), 2, np.where(attract.any(axis=1), 1, 0))
        return [VERDICTS[i] for i in out]

    @property
    def in_phase_stable(self) -> Mask:
        return np.asarray(self.in_phase_sum < -_ZERO, dtype=bool)

    @property
    def worst_m(self) -> Array:
        """Per job, the significant harmonic with the strongest attraction relative to its
        critical coupling (or the strongest, when none attracts)."""
        margin = np.where(
            self.significant,
            self.coupling_per_s / np.maximum(self.critical_per_s, 1e-300),
            -np.inf,
        )
        margin = np.where(self.significant & ~self.attractive, self.coupling_per_s, margin)
        return np.asarray(HARMONICS[np.argmax(margin, axis=1)])

    def job_dict(self, j: int) -> dict[str, Any]:
        """One job's analysis in the JSON shape of CONTRACT.md (`flexgate sync check`)."""
        attractive = self.attractive[j]
        return {
            "period_s": float(self.period_s[j]),
            "duty": float(self.duty[j]),
            "delay_s": self.delay_s,
            "window_s": self.window_s,
            "spread": self.spread,
            "gain_per_s": self.gain_per_s,
            "harmonics": [
                {
                    "m": int(m),
                    "weight": float(self.weight[j, i]),
                    "significant": bool(self.significant[j, i]),
                    "coupling_per_s": float(self.coupling_per_s[j, i]),
                    "attractive": bool(attractive[i]),
                    "critical_coupling_per_s": (
                        float(self.critical_per_s[j, i]) if attractive[i] else None
                    ),
                }
                for i, m in enumerate(HARMONICS)
            ],
            "in_phase_stable": bool(self.in_phase_stable[j]),
            "verdict": self.verdict[j],
            "max_safe_delay_s": finite_or_none(self.max_safe_delay_s[j]),
        }


def analyse(
    period_s: ArrayLike,
    duty: ArrayLike,
    *,
    delay_s: float,
    window_s: float = 0.0,
    spread: float = 0.0,
    gain_per_s: float = DEFAULT_GAIN_PER_S,
) -> Analysis:
    """The coupling that a loop with this delay and window puts on jobs of these periods."""
    t = np.atleast_1d(np.asarray(period_s, dtype=float))
    d = np.broadcast_to(np.asarray(duty, dtype=float), t.shape).copy()
    _check(t, d, delay_s, window_s, spread, gain_per_s)
    w = 2.0 * np.pi / t
    m = HARMONICS[None, :].astype(float)
    power = harmonic_power(m, d[:, None])
    gain = window_gain(m, t[:, None], window_s)
    weight = power * gain
    fundamental = power[:, :1]
    significant = np.abs(weight) >= SIGNIFICANT_SHARE * fundamental * (1 - 1e-12)
    tau_eff = delay_s + window_s / 2.0
    coupling = -gain_per_s * (power / fundamental) * gain * np.sin(m * w[:, None] * tau_eff)
    critical = critical_coupling_per_s(m, spread * w[:, None], tau_eff)
    return Analysis(
        period_s=t,
        duty=d,
        delay_s=float(delay_s),
        window_s=float(window_s),
        spread=float(spread),
        gain_per_s=float(gain_per_s),
        weight=weight,
        significant=significant,
        coupling_per_s=coupling,
        critical_per_s=critical,
        in_phase_sum=in_phase_sum(t, d, delay_s, window_s),
        max_safe_delay_s=max_safe_delay_s(t, significant, gain, window_s),
    )


def in_phase_sum(period_s: Array, duty: Array, delay_s: float, window_s: float) -> Array:
    """`S = sum_m m |c_m|^2 F_m sin(m w tau_eff)`, exactly (closed form, all harmonics)."""
    w = 2.0 * np.pi / period_s
    lo, hi = w * delay_s, w * (delay_s + window_s)
    pulse = 2.0 * np.pi * duty

    def measure(a: Array, b: Array, start: Array, end: Array) -> Array:
        """Length of {x in [a, b] : x mod 2pi in [start, end)}."""

        def cumulative(x: Array) -> Array:
            turns = np.floor(x / (2.0 * np.pi))
            return turns * (end - start) + np.clip(
                x - 2.0 * np.pi * turns - start, 0.0, end - start
            )

        return cumulative(b) - cumulative(a)

    if np.all(window_s > 1e-9 * period_s):  # shorter windows average nothing: a plain delay
        rising = measure(lo, hi, np.zeros_like(pulse), pulse)
        falling = measure(lo, hi, 2.0 * np.pi - pulse, np.full_like(pulse, 2.0 * np.pi))
        value = (rising - falling) / (hi - lo)
    else:
        phase = np.mod(lo, 2.0 * np.pi)
        near = 1e-9
        up = (phase > near) & (phase < pulse - near)
        down = (phase > 2.0 * np.pi - pulse + near) & (phase < 2.0 * np.pi - near)
        value = up.astype(float) - down.astype(float)
    return np.asarray(value / (4.0 * np.pi), dtype=float)


def max_safe_delay_s(period_s: Array, significant: Mask, gain: Array, window_s: float) -> Array:
    """The largest delay [s] below which no significant harmonic attracts.

    Harmonic m attracts where `F_m * sin(m w (tau + W/2)) < 0`; the sign of `F_m` does not
    depend on the delay, so the first attractive delay is where the sine next changes sign
    the wrong way (0 when it already attracts at no delay).
    """
    w = 2.0 * np.pi / period_s[:, None]
    m = HARMONICS[None, :].astype(float)
    theta0 = m * w * window_s / 2.0
    # Attractive half-cycles start at pi (F > 0) or at 0 (F < 0), modulo 2 pi.
    start = np.where(gain > 0, np.pi, 0.0)
    offset = np.mod(theta0 - start, 2.0 * np.pi)
    inside = (offset > 1e-12) & (offset < np.pi - 1e-12)
    to_next = np.where(inside, 0.0, np.mod(start - theta0, 2.0 * np.pi))
    first = np.where(np.abs(gain) < 1e-12, np.inf, to_next / (m * w))
    first = np.where(significant, first, np.inf)
    return np.asarray(first.min(axis=1), dtype=float)


def finite_or_none(value: float) -> float | None:
    """A delay limit for JSON: None where no delay makes any significant harmonic attract."""
    return float(value) if np.isfinite(value) else None


def worst_verdict(verdicts: list[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="safe")


def _check(
    period: Array, duty: Array, delay_s: float, window_s: float, spread: float, gain: float
) -> None:
    if np.any(~np.isfinite(period)) or np.any(period <= 0):
        raise FlexModelError("period_s must be positive")
    if np.any(~np.isfinite(duty)) or np.any((duty < MIN_DUTY) | (duty > 1 - MIN_DUTY)):
        raise FlexModelError(
            f"duty must lie between {MIN_DUTY:g} and 1 - {MIN_DUTY:g} (a two-level waveform; "
            "a share closer to 0 or 1 leaves no harmonic to couple through)"
        )
    for name, value in (
        ("delay_s", delay_s),
        ("window_s", window_s),
        ("spread", spread),
        ("gain_per_s", gain),
    ):
        if not np.isfinite(value) or value < 0:
            raise FlexModelError(f"{name} must be a finite number of at least 0, got {value!r}")
