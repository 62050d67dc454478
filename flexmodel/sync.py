"""Will a control loop make training jobs phase-lock? (docs/sync.md)

A job's power alternates between a compute level (share `duty` of each iteration of period
`T`) and a communication level. A loop that throttles jobs from its reading of shared power
couples them. A linear loop is its frequency response `H(i W)` (`LoopResponse`: a delay, a
moving average, a sample-and-hold, then proportional and integral gains); per harmonic `m` of
the waveform its effective attraction is

    a_m = K * (|c_m|^2 / |c_1|^2) * Im H(i m w)            w = 2*pi/T

with `|c_m|^2 = sin(pi*m*d)^2 / (pi*m)^2` the waveform's harmonic power and `K`
(`unit_coupling_per_s`) the coupling at the fundamental per unit of loop response: the jobs'
rate per watt turned into rad/s (`rate_coupling_per_s`). Positive `a_m` attracts: the jobs
drift into step on that harmonic. Two cases (docs/sync.md):

- a proportional throttle behind a delay `tau` and a moving average over `W`:
  `H = F_m exp(-i m w (tau + W/2))`, so `a_m = -K_m F_m sin(m w (tau + W/2))`, with
  `F_m = sin(x)/x`, `x = m*w*W/2`, the moving average's signed gain;
- an integrator: `H = (k_i / (i m w)) F_m exp(-i m w tau_eff)`, so
  `a_m = -K_m (k_i / (m w)) F_m cos(m w tau_eff)`: a quarter-period lag and a gain falling as
  `1/(m w)`; the fundamental attracts for `T/4 < tau_eff < 3T/4`, modulo `T`.

The loops are `flexmodel.loopresponse`'s (`LoopResponse`, and `ClosedLoopResponse` for a
sampled loop as it runs); the harmonics' power and the exact two-job criterion
(`in_phase_sum`) are `flexmodel.harmonics`'s.

- A harmonic is **significant** when `|c_m|^2 |F_m| |C(i m w)| >= 0.1 |c_1|^2 |C(i w)|`
  (m = 1..5), `C` the controller's gain `k_p + k_i/(i W)`.
- **Critical coupling** for a Lorentzian rate spread of half-width `gamma = spread * w`
  (Ott-Antonsen, docs/sync.md): harmonic `m` locks when
  `a_m > 2 * gamma * exp(m * gamma * tau_eff)`. In the variable `m * phi` both the rate spread
  and the coupling scale by `m`, so the threshold on `a_m` is the fundamental's `2 gamma`; only
  the lag factor grows with `m`. The exponential is the order-of-magnitude decoherence a delay
  adds across a spread population; at `gamma*tau << 1` the threshold is linear in the spread.
- **Verdict**: `safe` when no significant harmonic attracts; `unsafe` when one attracts beyond
  its critical coupling (with no spread, any attraction); `at-risk` when one attracts below it
  (locking can still be held by hysteresis once it happened).
- **Exact two-job criterion** over all harmonics (`flexmodel.harmonics`): in phase is stable
  iff `S = -sum_m m |c_m|^2 Im H(i m w) < 0`; a proportional loop's neutral band comes out
  exactly 0: neutral, not stable.

Everything is vectorised over jobs (arrays of periods and duties).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError
from flexmodel.harmonics import closed_in_phase_sum, harmonic_power, in_phase_sum
from flexmodel.loopresponse import ClosedLoopResponse, LoopResponse

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


def critical_coupling_per_s(m: ArrayLike, gamma_per_s: ArrayLike, tau_eff_s: float) -> Array:
    """The attraction [rad/s] at which harmonic `m` locks a Lorentzian population of rate
    half-width `gamma_per_s` behind an effective delay `tau_eff_s` (docs/sync.md:
    `2 gamma exp(m gamma tau)`; the spread and the coupling both scale by m in `m * phi`)."""
    gamma = np.asarray(gamma_per_s, dtype=float)
    return np.asarray(2.0 * gamma * np.exp(np.asarray(m) * gamma * tau_eff_s), dtype=float)


def rate_coupling_per_s(
    period_s: ArrayLike, duty: ArrayLike, *, swing_w: ArrayLike, rate_per_w: ArrayLike
) -> Array:
    """The coupling at the fundamental [rad/s] per unit of loop response (`unit_coupling_per_s`).

    `swing_w` is a job's compute power less its communication power (all its GPUs) [W], as
    the loop reads it; `rate_per_w` the fraction by which the job's compute phase slows per
    watt of the loop's correction [1/W]. Averaging `dphi/dt = w (1 - chi(phi) u)` with
    `u = rate_per_w * (h * P)(t)` gives `K = 2 w |c_1|^2 swing_w rate_per_w` (docs/sync.md;
    the same normalisation as `flexmodel.syncsim`).
    """
    w = 2.0 * np.pi / np.asarray(period_s, dtype=float)
    power = harmonic_power(1, duty)
    return np.asarray(2.0 * w * power * np.asarray(swing_w) * np.asarray(rate_per_w), dtype=float)


@dataclass(frozen=True)
class Analysis:
    """The coupling of one loop on J jobs; arrays are (J, 5) per harmonic or (J,)."""

    period_s: Array
    duty: Array
    loop: LoopResponse | ClosedLoopResponse
    spread: float
    gain_per_s: Array  #: the coupling at the fundamental before filters and delay, K |C(i w)|
    weight: Array  #: |c_m|^2 * F_m
    significant: Mask
    coupling_per_s: Array  #: a_m, positive = attractive
    critical_per_s: Array  #: the attraction at which harmonic m locks, for the spread
    max_safe_delay_s: Array

    @cached_property
    def in_phase_sum(self) -> Array:
        """`S` of the exact two-job criterion (worked out when asked: the verdict needs none)."""
        if isinstance(self.loop, ClosedLoopResponse):
            return closed_in_phase_sum(self.period_s, self.duty, self.loop)
        return in_phase_sum(self.period_s, self.duty, self.loop)

    @property
    def attractive(self) -> Mask:
        return np.asarray(self.coupling_per_s > _ZERO * self.gain_per_s[:, None], dtype=bool)

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
        """One job's analysis in the JSON shape docs/cli.md shows (`flexgate sync check`)."""
        attractive = self.attractive[j]
        return {
            "period_s": float(self.period_s[j]),
            "duty": float(self.duty[j]),
            "delay_s": self.loop.delay_s,
            "window_s": self.loop.window_s,
            "spread": self.spread,
            "gain_per_s": float(self.gain_per_s[j]),
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
    hold_s: float = 0.0,
    proportional_gain: float = 1.0,
    integral_gain_per_s: float = 0.0,
    spread: float = 0.0,
    gain_per_s: float = DEFAULT_GAIN_PER_S,
) -> Analysis:
    """The coupling that a loop with this delay, window, hold and gains puts on jobs of these
    periods, `gain_per_s` being the coupling at the fundamental per unit of loop response
    (the plain proportional throttle: its coupling at the fundamental)."""
    loop = LoopResponse(delay_s, window_s, hold_s, proportional_gain, integral_gain_per_s)
    return analyse_loop(period_s, duty, loop, unit_coupling_per_s=gain_per_s, spread=spread)


def analyse_loop(
    period_s: ArrayLike,
    duty: ArrayLike,
    loop: LoopResponse | ClosedLoopResponse,
    *,
    unit_coupling_per_s: ArrayLike,
    spread: float = 0.0,
) -> Analysis:
    """The coupling that `loop` puts on jobs of these periods and duties (docs/sync.md).

    `unit_coupling_per_s` [rad/s], per job or one for all: the coupling at the fundamental per
    unit of loop response (`rate_coupling_per_s` from the jobs' swing and rate per watt).
    """
    t = np.atleast_1d(np.asarray(period_s, dtype=float))
    d = np.broadcast_to(np.asarray(duty, dtype=float), t.shape).copy()
    unit = np.broadcast_to(np.asarray(unit_coupling_per_s, dtype=float), t.shape).copy()
    _check(t, d, unit, spread)
    w = 2.0 * np.pi / t
    m = HARMONICS[None, :].astype(float)
    mw = m * w[:, None]
    power = harmonic_power(m, d[:, None])
    fundamental = power[:, :1]
    if isinstance(loop, ClosedLoopResponse):
        return _analyse_closed(t, d, unit, loop, spread)
    filters = loop.filter_gain(mw)
    controller = np.abs(loop.controller(mw))
    reference = np.abs(loop.controller(w))[:, None]
    significant = power * np.abs(
        filters
    ) * controller >= SIGNIFICANT_SHARE * fundamental * reference * (1 - 1e-12)
    coupling = unit[:, None] * (power / fundamental) * np.imag(loop.response(mw))
    return Analysis(
        period_s=t,
        duty=d,
        loop=loop,
        spread=float(spread),
        gain_per_s=unit * reference[:, 0],
        weight=power * filters,
        significant=significant,
        coupling_per_s=coupling,
        critical_per_s=critical_coupling_per_s(m, spread * w[:, None], loop.effective_delay_s),
        max_safe_delay_s=max_safe_delay_s(t, significant, loop),
    )


def _analyse_closed(
    t: Array, d: Array, unit: Array, loop: ClosedLoopResponse, spread: float
) -> Analysis:
    """`analyse_loop` on a loop as it runs: the harmonics weighed by its whole response
    (significant at 10% of the fundamental's `|c_1|^2` at the loop's peak gain), `S` summed over
    `CLOSED_LOOP_HARMONICS` harmonics."""
    w = 2.0 * np.pi / t
    m = HARMONICS[None, :].astype(float)
    power = harmonic_power(m, d[:, None])
    fundamental = power[:, :1]
    response = loop.response(m * w[:, None])
    gain = np.abs(response)
    reference = gain[:, :1]
    # As the open loop's filters against its bare controller: a harmonic counts when its
    # response is a tenth of what the fundamental would get at the loop's peak gain (a loop
    # that passes the swing hardly at all couples nothing, whatever its phase).
    peak = loop.peak_gain()
    significant = power * gain >= SIGNIFICANT_SHARE * fundamental * peak * (1 - 1e-12)
    return Analysis(
        period_s=t,
        duty=d,
        loop=loop,
        spread=float(spread),
        gain_per_s=unit * reference[:, 0],
        weight=power * gain / np.maximum(reference, 1e-300),
        significant=significant,
        coupling_per_s=unit[:, None] * (power / fundamental) * np.imag(response),
        critical_per_s=critical_coupling_per_s(m, spread * w[:, None], loop.effective_delay_s),
        max_safe_delay_s=max_safe_delay_s(t, significant, loop),
    )


def max_safe_delay_s(
    period_s: Array, significant: Mask, loop: LoopResponse | ClosedLoopResponse
) -> Array:
    """The largest delay [s] below which no significant harmonic attracts (for one fixed
    delay; a loop with a measured distribution is judged on all of it by its verdict).

    `a_m` goes as `sin(psi_m - m w tau)`, `psi_m` the phase of the loop's response at no
    delay; it attracts while `m w tau - psi_m` lies in `(pi, 2 pi)` modulo `2 pi`, so the first
    attractive delay is where that angle next reaches pi (0 when it attracts at no delay).
    """
    w = 2.0 * np.pi / period_s[:, None]
    mw = HARMONICS[None, :].astype(float) * w
    undelayed = loop.undelayed(mw)
    theta0 = np.mod(-np.angle(undelayed), 2.0 * np.pi)
    inside = (theta0 > np.pi + 1e-12) & (theta0 < 2.0 * np.pi - 1e-12)
    to_next = np.where(inside, 0.0, np.mod(np.pi - theta0, 2.0 * np.pi))
    first = np.where(np.abs(undelayed) < 1e-12, np.inf, to_next / mw)
    first = np.where(significant, first, np.inf)
    return np.asarray(first.min(axis=1), dtype=float)


def finite_or_none(value: float) -> float | None:
    """A delay limit for JSON: None where no delay makes any significant harmonic attract."""
    return float(value) if np.isfinite(value) else None


def worst_verdict(verdicts: list[str]) -> str:
    return max(verdicts, key=VERDICTS.index, default="safe")


def _check(period: Array, duty: Array, unit: Array, spread: float) -> None:
    if np.any(~np.isfinite(period)) or np.any(period <= 0):
        raise FlexModelError("period_s must be positive")
    if np.any(~np.isfinite(duty)) or np.any((duty < MIN_DUTY) | (duty > 1 - MIN_DUTY)):
        raise FlexModelError(
            f"duty must lie between {MIN_DUTY:g} and 1 - {MIN_DUTY:g} (a two-level waveform; "
            "a share closer to 0 or 1 leaves no harmonic to couple through)"
        )
    if np.any(~np.isfinite(unit)) or np.any(unit < 0):
        raise FlexModelError("gain_per_s (the unit coupling) must be finite and at least 0")
    if not np.isfinite(spread) or spread < 0:
        raise FlexModelError(f"spread must be a finite number of at least 0, got {spread!r}")
