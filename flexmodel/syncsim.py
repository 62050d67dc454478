"""Integrating the delayed-throttle model of phase-locking (docs/sync.md).

Each job `i` advances through its iteration with phase `phi_i` (held in cycles, in [0, 1)):

    dphi_i/dt = f_i * (1 - chi(phi_i) * u(t)) + noise
    u(t) = c * y(t)                                ("linear" throttle)
    u(t) = c * max(y(t), 0)                        ("cap": a shared limit at the mean that only
                                                    binds above it)
    y(t) = k_p * (M(t) - mean level) + k_i * integral of (M(t) - B(t)) dt

`chi` is 1 in the compute phase (the first `duty` of the cycle), `P_i = 1` there and
`comm_power_fraction` otherwise; `M(t)` is the loop's reading of the aggregate (mean over jobs)
power: delayed by `tau` and, with a window `W`, averaged over `[t - tau - W, t - tau]`, and
with a hold `T_s`, sampled every `T_s` and held (`flexmodel.loopresponse.LoopResponse`). The
default is the proportional throttle, `k_p = 1`, `k_i = 0`.

The integrator is band-limited: `M - B` is the reading less its mean over the last
`INTEGRATOR_PERIODS` whole periods, taken twice (a second-order high-pass). A mean over whole
periods has zero gain at every harmonic of the period, so the integrator sees them unchanged;
what it removes is the DC and the slow drift, which would otherwise wind it up. In this model a
throttle lengthens compute phases, so a standing correction raises the mean it corrects: a
positive feedback that the real site loop does not have (a cap lowers compute power). Taken
once, the high-pass leaves the integrator a low-frequency gain of `k_i * span / 2` that lets
this feedback take over above a coupling of about 0.1 rad/s (T = 2 s); taken twice, above
about 0.2 rad/s.

The coefficient `c` is set from `gain_per_s` (K, rad/s at the fundamental per unit of loop
response) so that the averaged two-job coupling of a unit proportional loop has strength `K` at
harmonic 1, as `flexmodel.sync` assumes: `K = 2 * w * c * (1 - comm_power_fraction) * |c_1|^2`
(`sync.rate_coupling_per_s` with the swing `1 - comm_power_fraction` and `c` the rate per
unit of power). The "cap" throttle acts about half the time, so its effective strength is
about half.

Rates: `f_i = f * (1 + spread * x_i)` with `x_i` standard Lorentzian draws truncated to
[-5, 5] (so a few jobs do not run backwards); phase noise is Gaussian with standard deviation
`noise` cycles per sqrt(second). Fixed step `dt = period / steps_per_period`; the delay line is
a cumulative sum of the aggregate's history, so any delay and window cost one subtraction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError
from flexmodel.harmonics import harmonic_power
from flexmodel.loopresponse import LoopResponse
from flexmodel.sync import DEFAULT_GAIN_PER_S

THROTTLES = ("linear", "cap")
#: Whole periods over which the band-limited integrator's baseline is averaged.
INTEGRATOR_PERIODS = 4
_NOISE_BLOCK = 512  # steps of noise drawn at once


@dataclass(frozen=True)
class SyncRun:
    jobs: int
    period_s: float
    duty: float
    loop: LoopResponse
    gain_per_s: float
    spread: float
    duration_s: float
    comm_power_fraction: float
    dt_s: float
    time_s: Array  #: (S,) sample times
    order: Array  #: (S, 3) r_1..r_3 at each sample
    aggregate: Array  #: (steps,) aggregate power at every step (mean over jobs, compute = 1)
    final_phases: Array  #: (N,) in cycles
    phase_difference: float | None  #: two jobs only, radians in [0, pi]

    @property
    def delay_s(self) -> float:
        return self.loop.delay_s

    @property
    def window_s(self) -> float:
        return self.loop.window_s

    @property
    def swing_single(self) -> float:
        """One job's power standard deviation (compute level 1): the incoherent unit."""
        return float((1.0 - self.comm_power_fraction) * np.sqrt(self.duty * (1.0 - self.duty)))

    @property
    def swing_ratio(self) -> float:
        """The aggregate's standard deviation over the last quarter, against the incoherent
        `sqrt(N)` times one job's (about 1 when independent, `sqrt(N)` when locked)."""
        tail = self.aggregate[int(0.75 * self.aggregate.size) :]
        return float(np.sqrt(self.jobs) * tail.std() / self.swing_single)

    @property
    def final_order(self) -> Array:
        """r_1..r_3 averaged over the last quarter of the run."""
        tail = self.time_s >= 0.75 * self.duration_s
        return np.asarray(self.order[tail].mean(axis=0), dtype=float)

    def as_dict(self) -> dict[str, Any]:
        r1, r2, r3 = self.final_order
        final: dict[str, Any] = {"r1": float(r1), "r2": float(r2), "r3": float(r3)}
        if self.phase_difference is not None:
            final["phase_difference"] = self.phase_difference
        return {
            "jobs": self.jobs,
            "period_s": self.period_s,
            "duty": self.duty,
            "delay_s": self.delay_s,
            "window_s": self.window_s,
            "gain_per_s": self.gain_per_s,
            "spread": self.spread,
            "duration_s": self.duration_s,
            "final": final,
            "aggregate_swing_ratio": self.swing_ratio,
        }


def simulate_sync(
    *,
    jobs: int,
    period_s: float,
    duty: float,
    delay_s: float,
    window_s: float = 0.0,
    hold_s: float = 0.0,
    proportional_gain: float = 1.0,
    integral_gain_per_s: float = 0.0,
    gain_per_s: float = DEFAULT_GAIN_PER_S,
    spread: float = 0.0,
    duration_s: float = 600.0,
    seed: int = 1,
    noise: float = 0.0,
    comm_power_fraction: float = 0.5,
    throttle: str = "linear",
    steps_per_period: int = 200,
    samples: int = 600,
    initial_phases: Array | None = None,
    progress: Callable[[float], None] | None = None,
    offsets: str = "lorentzian",
) -> SyncRun:
    """Integrate the model; `initial_phases` (cycles) default to uniform random draws.
    `offsets="even"` spreads the rates as the gateway's scattering does (`loops.detune`):
    evenly over `[-2 spread, 0]`, a uniform spread of half-width `spread`."""
    loop = LoopResponse(delay_s, window_s, hold_s, proportional_gain, integral_gain_per_s)
    _check(jobs, period_s, duty, gain_per_s, spread, duration_s, throttle)
    rng = np.random.default_rng(seed)
    dt = period_s / steps_per_period
    steps = round(duration_s / dt)
    rate_dt = _rates(rng, jobs, period_s, spread, offsets) * dt
    phase = rng.random(jobs) if initial_phases is None else np.mod(np.asarray(initial_phases), 1.0)
    phase = phase.astype(float).copy()
    mean_level = comm_power_fraction + (1.0 - comm_power_fraction) * duty
    coef = _rate_per_unit(gain_per_s, period_s, duty, comm_power_fraction)
    span = INTEGRATOR_PERIODS * steps_per_period
    stepped = _SteppedLoop.of(loop, dt, steps, span, mean_level, coef, cap=throttle == "cap")
    noise_scale = noise * np.sqrt(dt)
    kicks = _phase_kicks(rng, jobs, noise_scale) if noise_scale else None
    every = max(steps // samples, 1)
    level, times, order = _integrate(
        phase, rate_dt, duty, comm_power_fraction, stepped, kicks, every, progress
    )
    return SyncRun(
        jobs=jobs,
        period_s=period_s,
        duty=duty,
        loop=loop,
        gain_per_s=gain_per_s,
        spread=spread,
        duration_s=steps * dt,
        comm_power_fraction=comm_power_fraction,
        dt_s=dt,
        time_s=np.array(times),
        order=np.array(order),
        aggregate=level,
        final_phases=phase,
        phase_difference=_phase_difference(phase) if jobs == 2 else None,
    )


def _rates(
    rng: np.random.Generator, jobs: int, period_s: float, spread: float, offsets: str
) -> Array:
    """The jobs' iteration rates [1/s]: the period's, offset by `spread` times standard
    Lorentzian draws truncated to [-5, 5], or (`offsets="even"`) evenly over [-2, 0]."""
    f0 = 1.0 / period_s
    lorentz = np.clip(np.tan(np.pi * (rng.random(jobs) - 0.5)), -5.0, 5.0)
    if offsets == "even":
        lorentz = np.linspace(-2.0, 0.0, jobs)
    elif offsets != "lorentzian":
        raise FlexModelError(f"offsets must be 'lorentzian' or 'even', got {offsets!r}")
    return np.asarray(f0 * (1.0 + spread * lorentz), dtype=float)


def _rate_per_unit(
    gain_per_s: float, period_s: float, duty: float, comm_power_fraction: float
) -> float:
    """`c`, the rate a job loses per unit of power, that gives a unit proportional loop the
    coupling `gain_per_s` at the fundamental (the module's docstring)."""
    f0 = 1.0 / period_s
    swing = 1.0 - comm_power_fraction
    c1 = float(harmonic_power(1, duty))
    return float(gain_per_s / (2.0 * (2.0 * np.pi * f0) * swing * c1))


@dataclass
class _SteppedLoop:
    """The loop step by step. Its reading of the aggregate power is delayed `lag` steps and
    averaged over `width`; for the integrator, less its baseline over `span` steps, twice. The
    reading's error from the mean level and that drift are held every `hold` steps, through
    the loop's gains, times `coef` (with `cap`, never below 0)."""

    loop: LoopResponse
    lag: int
    width: int
    hold: int
    span: int
    mean_level: float
    coef: float
    cap: bool
    dt: float
    history: Array  #: history[k]: the aggregate summed over steps < k (a cumulative delay line)
    passed: Array  #: the same for the reading less its baseline (the first pass)
    error: float = 0.0
    drift: float = 0.0
    integral: float = 0.0

    @classmethod
    def of(
        cls,
        loop: LoopResponse,
        dt: float,
        steps: int,
        span: int,
        mean_level: float,
        coef: float,
        *,
        cap: bool,
    ) -> _SteppedLoop:
        lag, width = round(loop.delay_s / dt), max(round(loop.window_s / dt), 1)
        hold = max(round(loop.hold_s / dt), 1)
        history, passed = np.zeros(steps + 1), np.zeros(steps + 1)
        return cls(loop, lag, width, hold, span, mean_level, coef, cap, dt, history, passed)

    def correction(self, k: int, now: float) -> float:
        """Record step `k`'s aggregate power `now`; the correction the jobs get then."""
        reading, twice = self._reading(k, now)
        if k % self.hold == 0:
            self.error, self.drift = reading - self.mean_level, twice
        self.integral += self.loop.integral_gain_per_s * self.drift * self.dt
        u = self.coef * (self.loop.proportional_gain * self.error + self.integral)
        return max(u, 0.0) if self.cap else u

    def _reading(self, k: int, now: float) -> tuple[float, float]:
        """The reading after step `k`, and its band-limited drift (0 without an integrator)."""
        history, passed, span = self.history, self.passed, self.span
        history[k + 1] = history[k] + now
        end = k - self.lag  # the reading covers steps [end - width + 1, end]
        if end >= 0:
            start = max(end - self.width + 1, 0)
            reading = (history[end + 1] - history[start]) / (end + 1 - start)
        else:
            reading = self.mean_level  # before the loop has history, it sees the mean
        if self.loop.integral_gain_per_s and end >= span:  # the baselines need whole periods
            once = reading - (history[end + 1] - history[end + 1 - span]) / span
            passed[k + 1] = passed[k] + once
            twice = once - (passed[k + 1] - passed[max(k + 1 - span, 0)]) / span
        else:
            passed[k + 1] = passed[k]
            twice = 0.0
        return reading, twice


def _phase_kicks(rng: np.random.Generator, jobs: int, scale: float) -> Iterator[Array]:
    """Each step's phase noise [cycles], drawn `_NOISE_BLOCK` steps at a time."""
    while True:
        yield from rng.standard_normal((_NOISE_BLOCK, jobs)) * scale


def _integrate(
    phase: Array,
    rate_dt: Array,
    duty: float,
    comm_power_fraction: float,
    loop: _SteppedLoop,
    kicks: Iterator[Array] | None,
    every: int,
    progress: Callable[[float], None] | None,
) -> tuple[Array, list[float], list[list[float]]]:
    """Step the jobs' phases (in place) through `loop`: the aggregate power at every step, and
    every `every` steps the time [s] and the order parameters r_1..r_3."""
    jobs, steps = rate_dt.size, loop.history.size - 1
    swing = 1.0 - comm_power_fraction
    level = np.empty(steps)
    times: list[float] = []
    order: list[list[float]] = []
    for k in range(steps):
        compute = phase < duty
        now = comm_power_fraction + swing * np.count_nonzero(compute) / jobs
        level[k] = now
        phase += rate_dt * (1.0 - loop.correction(k, now) * compute)
        if kicks is not None:
            phase += next(kicks)
        phase -= np.floor(phase)
        if k % every == 0:
            times.append((k + 1) * loop.dt)
            angle = 2.0 * np.pi * phase
            order.append([float(np.abs(np.exp(1j * m * angle).mean())) for m in (1, 2, 3)])
            if progress is not None:
                progress((k + 1) / steps)
    return level, times, order


def _phase_difference(phase: Array) -> float:
    """Two jobs' phase difference [rad], in [0, pi]."""
    gap = 2.0 * np.pi * (phase[0] - phase[1])
    return float(abs(np.angle(np.exp(1j * gap))))


def _check(
    jobs: int,
    period_s: float,
    duty: float,
    gain: float,
    spread: float,
    duration_s: float,
    throttle: str,
) -> None:
    if jobs < 1:
        raise FlexModelError("jobs must be at least 1")
    if not (np.isfinite(period_s) and period_s > 0):
        raise FlexModelError("period_s must be positive")
    if not 0 < duty < 1:
        raise FlexModelError("duty must lie strictly between 0 and 1")
    if not (np.isfinite(duration_s) and duration_s >= period_s):
        raise FlexModelError("duration_s must cover at least one period")
    for name, value in (("gain_per_s", gain), ("spread", spread)):
        if not np.isfinite(value) or value < 0:
            raise FlexModelError(f"{name} must be a finite number of at least 0, got {value!r}")
    if throttle not in THROTTLES:
        raise FlexModelError(f"unknown throttle '{throttle}' (choose from linear, cap)")
