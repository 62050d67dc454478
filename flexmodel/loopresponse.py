"""A loop's frequency response, from the jobs' power swing to the throttle they get
(docs/sync.md): what `flexmodel.sync` judges a loop by.

- `LoopResponse`, a linear loop: a delay, a moving average, a sample-and-hold, then
  proportional and integral gains, `H(i W)` in closed form;
- `ClosedLoopResponse`, a sampled loop as it runs (the site loop of
  `gateway.services.tracking`): its window, meter path, Smith predictor and controller.

A sample-and-hold over `T_s` has the moving average's response over `T_s` (its zero-order hold;
the aliases it also makes beat at other frequencies and average out of the phase dynamics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError

Complex = NDArray[np.complex128]

#: frequency-delay terms of `LoopResponse.delay_factor` worked out at once
DELAY_FACTOR_TERMS = 1 << 16
#: A first-order lag is taken as settled after this many time constants (exp(-21) < 1e-9: the
#: site loop counts a move as seen whole at 1 - 1e-9).
_SETTLED_TAUS = 21.0


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
