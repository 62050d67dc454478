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

A sample-and-hold over `T_s` has the moving average's response over `T_s` (its zero-order hold;
the aliases it also makes beat at other frequencies and average out of the phase dynamics).

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
- **Exact two-job criterion** over all harmonics: in phase is stable iff
  `S = -sum_m m |c_m|^2 Im H(i m w) < 0`. In time, `S` is the loop's impulse response `h`
  integrated against `g(w t) = sum_m m |c_m|^2 sin(m w t)`, minus half the derivative of the
  pulse's autocorrelation: a step function of `theta mod 2*pi`, `+1/(4 pi)` below `2 pi d`,
  `-1/(4 pi)` above `2 pi (1 - d)`, both where they overlap. The proportional part of `h` is
  the delay smeared by the window and the hold (`g` averaged over them); the integral part is
  a step, so it integrates `g` once more (the triangle of the autocorrelation). So `S` is
  exact, and the neutral band of a proportional loop (`d' T < tau < (1 - d') T`,
  `d' = min(d, 1 - d)`) comes out exactly 0: neutral, not stable.

Everything is vectorised over jobs (arrays of periods and duties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
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
Complex = NDArray[np.complex128]


#: The shortest compute share analysed: below it |c_1|^2 underflows and the coupling is 0/0.
MIN_DUTY = 1e-6
#: frequency-delay terms of `LoopResponse.delay_factor` worked out at once
DELAY_FACTOR_TERMS = 1 << 16


def harmonic_power(m: ArrayLike, duty: ArrayLike) -> Array:
    """`|c_m|^2` of a two-level waveform with compute share `duty`."""
    m = np.asarray(m, dtype=float)
    return np.asarray(np.sin(np.pi * m * np.asarray(duty)) ** 2 / (np.pi * m) ** 2, dtype=float)


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


def window_gain(m: ArrayLike, period_s: ArrayLike, window_s: ArrayLike) -> Array:
    """`F_m`: the signed gain of a moving average over `window_s` at harmonic `m`."""
    x = np.asarray(m) * np.pi * np.asarray(window_s) / np.asarray(period_s)  # m * w * W / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(np.abs(x) < 1e-12, 1.0, np.sin(x) / x), dtype=float)


@dataclass(frozen=True)
class LoopResponse:
    """A linear loop from measured shared power to the jobs' throttle (docs/sync.md):
    a delay, a moving average over `window_s`, a sample-and-hold every `hold_s`, then
    `proportional_gain` [W of correction per W of error] and `integral_gain_per_s` [W per
    W s]. The default is the delayed proportional throttle of unit gain."""

    delay_s: float = 0.0
    window_s: float = 0.0
    hold_s: float = 0.0
    proportional_gain: float = 1.0
    integral_gain_per_s: float = 0.0
    #: Measured delays [s]: where given, the loop's delay is their distribution, not one value
    #: (`delay_s` is then their mean: `LoopResponse.measured`). The attractive windows repeat
    #: every period, so a single percentile is not a worst case: the response averages
    #: `exp(-i W tau)` over them.
    delay_samples_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("delay_s", "window_s", "hold_s", "proportional_gain", "integral_gain_per_s"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise FlexModelError(f"{name} must be a finite number of at least 0, got {value!r}")
        samples = np.asarray(self.delay_samples_s, dtype=float)
        if np.any(~np.isfinite(samples)) or np.any(samples < 0):
            raise FlexModelError("delay_samples_s must be finite delays of at least 0")
        if samples.size and abs(float(samples.mean()) - self.delay_s) > 1e-9 * max(
            1.0, self.delay_s
        ):
            raise FlexModelError("delay_s must be the mean of delay_samples_s")

    @classmethod
    def measured(cls, delay_samples_s: ArrayLike, **loop: float) -> LoopResponse:
        """The loop with its delay distributed as measured (at least one sample)."""
        samples = tuple(float(v) for v in np.atleast_1d(np.asarray(delay_samples_s, dtype=float)))
        if not samples:
            raise FlexModelError("a measured delay needs at least one sample")
        return cls(delay_s=float(np.mean(samples)), delay_samples_s=samples, **loop)

    def at_delay(self, delay_s: float) -> LoopResponse:
        """The same loop with one fixed delay."""
        return replace(self, delay_s=delay_s, delay_samples_s=())

    @property
    def effective_delay_s(self) -> float:
        """The delay plus the half-widths of the moving average and the hold (their lags)."""
        return self.delay_s + self.window_s / 2.0 + self.hold_s / 2.0

    def filter_gain(self, w_rad_per_s: ArrayLike) -> Array:
        """The signed real gain of the moving average and the hold at `w` (lags removed)."""
        period = 2.0 * np.pi / np.asarray(w_rad_per_s, dtype=float)
        return window_gain(1, period, self.window_s) * window_gain(1, period, self.hold_s)

    def controller(self, w_rad_per_s: ArrayLike) -> Complex:
        """`C(i w) = k_p + k_i / (i w)`."""
        w = np.asarray(w_rad_per_s, dtype=float)
        return np.asarray(self.proportional_gain + self.integral_gain_per_s / (1j * w))

    def undelayed(self, w_rad_per_s: ArrayLike) -> Complex:
        """`H(i w)` without the delay: the controller behind the filters and their lags."""
        w = np.asarray(w_rad_per_s, dtype=float)
        lag = np.exp(-1j * w * (self.window_s / 2.0 + self.hold_s / 2.0))
        return np.asarray(self.controller(w) * self.filter_gain(w) * lag)

    def delay_factor(self, w_rad_per_s: ArrayLike) -> Complex:
        """`E[exp(-i w tau)]` over the delay's distribution (one value: `exp(-i w delay)`)."""
        w = np.asarray(w_rad_per_s, dtype=float)
        if not self.delay_samples_s:
            return np.asarray(np.exp(-1j * w * self.delay_s))
        samples = np.asarray(self.delay_samples_s, dtype=float)
        # A slice of the frequencies at a time: at 10,000 jobs, five harmonics and 64 delays,
        # all at once is an 80 MB temporary, whose first touch alone took as long as the sum.
        flat = w.ravel()
        out = np.empty(flat.shape, dtype=complex)
        step = max(DELAY_FACTOR_TERMS // samples.size, 1)
        for i in range(0, flat.size, step):
            phases = np.multiply.outer(flat[i : i + step], samples)
            out[i : i + step] = np.exp(-1j * phases).mean(axis=-1)
        return out.reshape(w.shape)

    def response(self, w_rad_per_s: ArrayLike) -> Complex:
        """`H(i w)`: the controller behind the filters and the delay."""
        if self.delay_samples_s:
            return np.asarray(self.undelayed(w_rad_per_s) * self.delay_factor(w_rad_per_s))
        w = np.asarray(w_rad_per_s, dtype=float)
        lag = np.exp(-1j * w * self.effective_delay_s)
        return np.asarray(self.controller(w) * self.filter_gain(w) * lag)


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


def closed_in_phase_sum(period_s: Array, duty: Array, loop: ClosedLoopResponse) -> Array:
    """`S = -sum_m m |c_m|^2 Im H(i m w)` of a loop as it runs, over `CLOSED_LOOP_HARMONICS`."""
    w = 2.0 * np.pi / period_s
    many = np.arange(1, CLOSED_LOOP_HARMONICS + 1, dtype=float)[None, :]
    all_power = harmonic_power(many, duty[:, None])
    response = loop.response(many * w[:, None])
    return np.asarray(-np.sum(many * all_power * np.imag(response), axis=1), dtype=float)


def in_phase_sum(period_s: Array, duty: Array, loop: LoopResponse) -> Array:
    """`S = -sum_m m |c_m|^2 Im H(i m w)`, exactly (closed form, all harmonics).

    `S = integral of h(t) g(w t) dt`: the proportional part of `h` is the delay smeared by the
    window and the hold, so it averages `g` over them; the integral part is a step from the
    same point, `integral from x of g = -(G_1(x) - mean G_1) / w` (`G_1` an antiderivative of
    `g`; the mean removed because a band-limited integrator passes no DC).
    """
    if loop.delay_samples_s:  # linear in h: the mean over the delay's distribution
        sums = [in_phase_sum(period_s, duty, loop.at_delay(d)) for d in loop.delay_samples_s]
        return np.asarray(np.mean(sums, axis=0), dtype=float)
    w = 2.0 * np.pi / period_s
    pulse = 2.0 * np.pi * duty
    start = np.mod(w * loop.delay_s, 2.0 * np.pi)  # S repeats every period of the delay
    widths = [w * loop.window_s, w * loop.hold_s]
    widths = [x for x in widths if np.all(x > 1e-9 * 2.0 * np.pi)]  # shorter ones average nothing
    value = loop.proportional_gain * _smeared(start, widths, 0, pulse)
    if loop.integral_gain_per_s:
        mean = _step_antiderivative(np.full_like(pulse, 2.0 * np.pi), pulse, 2) / (2.0 * np.pi)
        triangle = _smeared(start, widths, 1, pulse) - mean
        value = value - loop.integral_gain_per_s * triangle / w
    return np.asarray(value / (4.0 * np.pi), dtype=float)


def _smeared(start: Array, widths: list[Array], order: int, pulse: Array) -> Array:
    """The mean of the `order`-th antiderivative of the step over `start + U`, `U` the sum of
    uniform draws over `widths` (each box mean is a difference of the next antiderivative)."""
    if not widths:
        return _step_antiderivative(start, pulse, order)
    width, rest = widths[0], widths[1:]
    upper = _smeared(start + width, rest, order + 1, pulse)
    return (upper - _smeared(start, rest, order + 1, pulse)) / width


def _step_antiderivative(x: Array, pulse: Array, order: int) -> Array:
    """The `order`-th antiderivative from 0 of the step `1[theta < p] - 1[theta >= 2 pi - p]`
    (`theta = x mod 2 pi`, `p` the pulse), exactly, for x >= 0 and order 0..3.

    Over one period it is a sum of ramps `(r - b)_+^k / k!` at the step's edges. The step has
    no mean, so its first antiderivative repeats every period; the second gains `I_1` (the
    first's integral over a period) each period, the third `2 pi I_1 n + I_2` on top.
    """
    if order == 0:  # the edges count as 0, so the neutral band comes out exactly 0
        phase, near = np.mod(x, 2.0 * np.pi), 1e-9
        up = (phase > near) & (phase < pulse - near)
        down = (phase > 2.0 * np.pi - pulse + near) & (phase < 2.0 * np.pi - near)
        return np.asarray(up.astype(float) - down.astype(float))
    turns = np.floor(x / (2.0 * np.pi))
    r = x - 2.0 * np.pi * turns
    period = np.full_like(r, 2.0 * np.pi)

    def ramps(y: Array, k: int) -> Array:
        edges = (np.zeros_like(pulse), pulse, 2.0 * np.pi - pulse)
        signs = (1.0, -1.0, -1.0)
        total = sum(s * np.clip(y - b, 0.0, None) ** k for s, b in zip(signs, edges, strict=True))
        return np.asarray(total / math.factorial(k))

    if order == 1:
        return ramps(r, 1)
    i1 = ramps(period, 2)
    if order == 2:
        return np.asarray(turns * i1 + ramps(r, 2))
    i2 = ramps(period, 3)
    return np.asarray(
        i1 * 2.0 * np.pi * turns * (turns - 1) / 2 + turns * i2 + turns * i1 * r + ramps(r, 3)
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


#: Harmonics summed in a closed loop's two-job criterion (its response falls off as a low
#: pass, so the sum converges well before; the sampled loop's aliases are not followed).
CLOSED_LOOP_HARMONICS = 64
#: A first-order lag is taken as settled after this many time constants (exp(-21) < 1e-9: the
#: site loop counts a move as seen whole at 1 - 1e-9).
_SETTLED_TAUS = 21.0


@dataclass(frozen=True)
class ClosedLoopResponse:
    """A sampled loop as it runs (docs/sync.md, "The closed loop"): the site loop of
    `gateway.services.tracking`, from the jobs' power swing to the correction they get.

    Every `period_s` the loop averages the last `window_s` of meter readings; a reading shows
    the GPUs' power through the meter path (`dead_s`, a first-order `lag_s`, each reading's
    own `averaging_s`). A Smith predictor (`predicted`) adds what the loop's own moves will
    still do to the window by its model of the path (`model_dead_s`, `model_lag_s`), so the
    error is the swing read at the meter less the correction so far, plus the model's mismatch.
    The controller `C(z) = k / (1 - z^-1) + k_p` (`gain`: the integral gain times the period)
    sets the correction, which the jobs get after `actuation_s` (plan, dispatch, the agents'
    actuation; `actuation_samples_s` where measured) and hold for a period:

        c(z) = C W_N P / (1 + C F) * swing          (the correction, sampled)
        H(i w) = c(z) ZOH(w) E[exp(-i w actuation)]  (what the jobs get)

    `W_N` the window's mean of N readings, `P` the meter path at `w`, `F` what the loop's error
    sees of its own correction: `z^-1` with a right model, plus `(1 - z^-1) M(z)` with
    `M(z) = sum_l (S(l) - S0(l)) z^-(l+1)`, `S` and `S0` the true and modelled share of a move
    that the window shows `l + 1` samples on (without the predictor: `S` alone).
    """

    period_s: float
    gain: float
    window_s: float = 0.0
    dead_s: float = 0.0
    lag_s: float = 0.0
    averaging_s: float = 0.0
    actuation_s: float = 0.0
    proportional_gain: float = 0.0
    model_dead_s: float | None = None  #: the predictor's meter dead time (None: the true one)
    model_lag_s: float | None = None  #: the predictor's lag (None: the true one)
    predicted: bool = True
    actuation_samples_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (np.isfinite(self.period_s) and self.period_s > 0):
            raise FlexModelError(f"period_s must be positive, got {self.period_s!r}")
        for name in (
            "gain",
            "window_s",
            "dead_s",
            "lag_s",
            "averaging_s",
            "actuation_s",
            "proportional_gain",
        ):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise FlexModelError(f"{name} must be a finite number of at least 0, got {value!r}")
        samples = np.asarray(self.actuation_samples_s, dtype=float)
        if np.any(~np.isfinite(samples)) or np.any(samples < 0):
            raise FlexModelError("actuation_samples_s must be finite delays of at least 0")

    # The attributes the open-loop `LoopResponse` offers to `ControlLoop.evaluate`.
    @property
    def delay_s(self) -> float:
        """The loop's delay: actuation, the meter's dead time and lag [s]."""
        return self.actuation_s + self.dead_s + self.lag_s

    @property
    def delay_samples_s(self) -> tuple[float, ...]:
        return tuple(d + self.dead_s + self.lag_s for d in self.actuation_samples_s)

    @property
    def hold_s(self) -> float:
        return self.period_s

    @property
    def effective_delay_s(self) -> float:
        """The delay a rate spread decoheres over: the loop's delay and the lags of the
        readings' averaging, the window and the hold [s]."""
        return self.delay_s + (self.averaging_s + self.window_s + self.period_s) / 2.0

    @property
    def readings(self) -> int:
        """Readings the window averages (at least one)."""
        return max(round(self.window_s / self.period_s), 1)

    def _share(self, since_s: Array, dead_s: float, lag_s: float) -> Array:
        """The share of a move that a reading `since_s` after its plan shows."""
        after = since_s[..., None] - self.actuation_s - dead_s
        if self.averaging_s > 0:
            points = 16  # as `flexmodel.meterpath.step_share`
            after = after - self.averaging_s * (np.arange(points) + 0.5) / points
        after = np.maximum(after, 0.0)
        shown = (after > 0).astype(float) if lag_s <= 0 else -np.expm1(-after / lag_s)
        return np.asarray(shown.mean(axis=-1), dtype=float)

    def _window_shares(self, lags: Array, dead_s: float, lag_s: float) -> Array:
        """`S(l)`: the window's mean share of a move planned `l + 1` samples before."""
        n = np.arange(self.readings)
        since = (lags[:, None] + 1.0 - n[None, :]) * self.period_s
        return np.asarray(self._share(since, dead_s, lag_s).mean(axis=1), dtype=float)

    def _feedback(self, z_inv: Complex) -> Complex:
        """`F(z)`: what the loop's error sees of its own correction."""
        dead0 = self.dead_s if self.model_dead_s is None else self.model_dead_s
        lag0 = self.lag_s if self.model_lag_s is None else self.model_lag_s
        horizon_s = (
            self.actuation_s
            + max(self.dead_s, dead0)
            + _SETTLED_TAUS * max(self.lag_s, lag0)
            + self.averaging_s
            + self.window_s
        )
        lags = np.arange(math.ceil(horizon_s / self.period_s) + 2, dtype=float)
        true = self._window_shares(lags, self.dead_s, self.lag_s)
        powers = z_inv[..., None] ** (lags + 1.0)
        if not self.predicted:
            # Without the predictor every reading shows the moves as they arrive; a move
            # past the horizon is whole.
            tail = z_inv ** (lags[-1] + 2.0) / (1.0 - z_inv)
            return np.asarray((1.0 - z_inv) * ((powers @ true) + tail))
        model = self._window_shares(lags, dead0, lag0)
        return np.asarray(z_inv + (1.0 - z_inv) * (powers @ (true - model)))

    def meter(self, w_rad_per_s: ArrayLike) -> Complex:
        """`P(i w)`: a reading of a unit swing of the GPUs' power (dead time, lag, averaging)."""
        w = np.asarray(w_rad_per_s, dtype=float)
        lag = np.exp(-1j * w * self.dead_s) / (1.0 + 1j * w * self.lag_s)
        return np.asarray(lag * _box(w, self.averaging_s))

    def correction(self, w_rad_per_s: ArrayLike) -> Complex:
        """The correction per unit swing of the jobs' power at `w`, as the loop samples it
        [kW/kW]: what a lock-in on the loop's correction measures."""
        w = np.asarray(w_rad_per_s, dtype=float)
        z_inv = np.exp(-1j * w * self.period_s)
        n = self.readings
        with np.errstate(divide="ignore", invalid="ignore"):
            window = np.where(
                np.abs(1.0 - z_inv) < 1e-12, 1.0, (1.0 - z_inv**n) / (n * (1.0 - z_inv))
            )
            controller = self.gain / (1.0 - z_inv) + self.proportional_gain
            loop = controller * window * self.meter(w) / (1.0 + controller * self._feedback(z_inv))
        return np.asarray(loop)

    def actuation(self, w_rad_per_s: ArrayLike) -> Complex:
        """`E[exp(-i w actuation)]` over the measured actuation delays (or the one given)."""
        w = np.asarray(w_rad_per_s, dtype=float)
        if not self.actuation_samples_s:
            return np.asarray(np.exp(-1j * w * self.actuation_s))
        samples = np.asarray(self.actuation_samples_s, dtype=float)
        return np.asarray(np.exp(-1j * np.multiply.outer(w, samples)).mean(axis=-1))

    def undelayed(self, w_rad_per_s: ArrayLike) -> Complex:
        """The jobs' response without the actuation delay: the sampled correction, held."""
        w = np.asarray(w_rad_per_s, dtype=float)
        return np.asarray(self.correction(w) * _box(w, self.period_s))

    def response(self, w_rad_per_s: ArrayLike) -> Complex:
        """`H(i w)`: the correction the jobs get per unit swing of their power."""
        return np.asarray(self.undelayed(w_rad_per_s) * self.actuation(w_rad_per_s))

    def peak_gain(self) -> float:
        """The largest `|c|` of the sampled correction up to the Nyquist frequency."""
        w = np.linspace(1e-3, 1.0, 512) * math.pi / self.period_s
        return float(np.max(np.abs(self.correction(w))))


def _box(w: Array, width_s: float) -> Complex:
    """A mean over the last `width_s`: `(1 - exp(-i w W)) / (i w W)`."""
    x = np.asarray(w * width_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(np.abs(x) < 1e-12, 1.0 + 0j, -np.expm1(-1j * x) / (1j * x))
    return np.asarray(out)


#: The band of a large load's oscillation that grid rules watch by default [Hz] (arXiv
#: 2508.14318: 0.1-20 Hz, AI training's swings at 0.2-3 Hz).
OSCILLATION_BAND_HZ = (0.1, 20.0)


def site_oscillation(
    power_kw: ArrayLike,
    sample_period_s: float,
    *,
    periods_s: ArrayLike = (),
    band_hz: tuple[float, float] = OSCILLATION_BAND_HZ,
) -> dict[str, Any]:
    """The site power's swing at the fleet's dominant periods and its spectral energy in a band,
    from evenly spaced samples, clamped to what they can observe.

    A source sampled every `sample_period_s` sees up to its Nyquist frequency and no lower than
    one cycle over the record: the band is cut to that (`band_observed_hz`), and where nothing
    of it is left the energy is None with the reason. Each period's swing is the amplitude of
    the sinusoid fitted at it [kW] (None where it is beyond the source). `rms_kw`: the root of
    the power's variance within the observed band [kW] (Parseval, a Hann window)."""
    x = np.asarray(power_kw, dtype=float)
    if x.ndim != 1 or x.size < 4 or not np.all(np.isfinite(x)) or not sample_period_s > 0:
        raise FlexModelError("power_kw must be at least 4 finite samples, sample_period_s > 0")
    low_hz, high_hz = band_hz
    if not 0 <= low_hz < high_hz:
        raise FlexModelError(f"band_hz must be (low, high) with 0 <= low < high, got {band_hz!r}")
    nyquist_hz = 0.5 / sample_period_s
    lowest_hz = 1.0 / (x.size * sample_period_s)
    seen = (max(low_hz, lowest_hz), min(high_hz, nyquist_hz))
    t = sample_period_s * np.arange(x.size)
    swings = []
    for period in np.atleast_1d(np.asarray(periods_s, dtype=float)):
        f = 1.0 / period
        if not lowest_hz <= f < nyquist_hz:
            swings.append({"period_s": float(period), "swing_kw": None})
            continue
        design = np.column_stack(
            [np.ones_like(t), np.cos(2 * np.pi * f * t), np.sin(2 * np.pi * f * t)]
        )
        fit, *_ = np.linalg.lstsq(design, x, rcond=None)
        swings.append({"period_s": float(period), "swing_kw": float(np.hypot(fit[1], fit[2]))})
    out: dict[str, Any] = {
        "band_hz": [low_hz, high_hz],
        "band_observed_hz": None,
        "rms_kw": None,
        "reason": None,
        "swings": swings,
    }
    if seen[0] >= seen[1]:
        out["reason"] = (
            f"a source read every {sample_period_s:g} s sees {lowest_hz:.3g}-{nyquist_hz:.3g} Hz: "
            f"nothing of {low_hz:g}-{high_hz:g} Hz"
        )
        return out
    window = np.hanning(x.size)
    spectrum = np.fft.rfft((x - x.mean()) * window)
    freqs = np.fft.rfftfreq(x.size, sample_period_s)
    # Parseval over the window's energy: the one-sided spectrum counts each frequency twice.
    density = np.abs(spectrum) ** 2 / np.sum(window**2)
    density[1:] *= 2.0
    inside = (freqs >= seen[0]) & (freqs <= seen[1])
    out["band_observed_hz"] = [float(seen[0]), float(seen[1])]
    out["rms_kw"] = float(np.sqrt(density[inside].sum() / x.size))
    return out
