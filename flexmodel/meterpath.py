"""The meter's path: how a step of the GPUs' power reaches the facility meter.

docs/model.md, section 3, "The meter's path".

A facility meter reads a GPU step late and smoothed, in three parts kept apart:

- `dead_s`: pure transport delay (the meter's own polling, a BMS or SCADA hop, a revenue
  meter's register update): nothing of the step shows before it;
- `tau_s`: the cooling plant's and the meter's first-order lag after that;
- `averaging_s`: each reading is the mean over the last `averaging_s` (a meter's demand
  interval, the agents' sample window on the estimate): known from the meter's setting, not
  fitted.

    share(t) = mean over v in [0, averaging_s] of F(t - v),
    F(s) = 0 for s < dead_s, 1 - exp(-(s - dead_s) / tau_s) after           (FOPDT)

`fit_meter_path` identifies `dead_s` and `tau_s` with standard errors from a step response
sampled every period (`flexmodel.calibration` measures it on the meter's history). A half-rise
time is not a time constant: a first-order meter of tau reaches half at tau ln 2, so using the
half-rise as tau under-states the lag by 31%.

A parameter the data cannot pin down (its standard error above half its value and above one
sample period) is reported as not identified; the loop then uses a stated conservative value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares

from flexmodel.errors import FlexModelError

Array = NDArray[np.float64]

#: Points over the averaging window (and over the sample period a step can fall in).
_AVERAGING_POINTS = 16


@dataclass(frozen=True)
class MeterPath:
    dead_s: float  #: pure delay before a step shows [s]
    tau_s: float  #: first-order time constant after it [s]
    averaging_s: float = 0.0  #: each reading's own averaging window [s]
    dead_stderr_s: float | None = None  #: None: configured or not identified [s]
    tau_stderr_s: float | None = None  #: [s]
    source: str = "configured"  #: configured, identified, or the reason a part was not

    @property
    def half_rise_s(self) -> float:
        """When a reading shows half of a step (without the averaging) [s]."""
        return self.dead_s + self.tau_s * math.log(2.0)

    def settle_s(self) -> float:
        """When a reading shows 95% of a step: dead time, three time constants, the averaging."""
        return self.dead_s + 3.0 * self.tau_s + self.averaging_s

    def share(self, since_s: float) -> float:
        """The share of a unit step, `since_s` after it, that one reading shows."""
        return float(step_share(np.array([since_s]), self.dead_s, self.tau_s, self.averaging_s)[0])


def step_share(since_s: Array, dead_s: float, tau_s: float, averaging_s: float = 0.0) -> Array:
    """`MeterPath.share` at each of `since_s` [s]."""
    since = np.asarray(since_s, dtype=float)
    if averaging_s > 0:
        offsets = averaging_s * (np.arange(_AVERAGING_POINTS) + 0.5) / _AVERAGING_POINTS
        return np.asarray(np.mean(_fopdt(since[:, None] - offsets, dead_s, tau_s), axis=1))
    return _fopdt(since, dead_s, tau_s)


def _fopdt(since_s: Array, dead_s: float, tau_s: float) -> Array:
    after = np.maximum(since_s - dead_s, 0.0)
    if tau_s <= 0:
        return np.asarray((after > 0).astype(float))
    return np.asarray(-np.expm1(-after / tau_s))


def fit_meter_path(
    response: ArrayLike, *, period_s: float, averaging_s: float = 0.0, noise_sd: float
) -> MeterPath:
    """Dead time and time constant from a unit-step response sampled every `period_s`.

    response : the meter's move per unit GPU step, sample by sample from the first sample at
        which the GPUs showed the step [kW/kW]; its settled end is normalised to 1
    averaging_s : each meter reading's own averaging window (known, not fitted) [s]
    noise_sd : one standard deviation of a response sample's noise [kW/kW]

    The GPU step happened somewhere in the period before its first sample, so each response
    sample is compared with the model averaged over that period too. The standard errors come
    from the fit's Jacobian and the larger of the residuals' scatter and the noise given.
    """
    values = np.asarray(response, dtype=float)
    if values.ndim != 1 or values.size < 4 or not np.all(np.isfinite(values)):
        raise FlexModelError("the step response must be a finite series of at least 4 samples")
    if not period_s > 0 or not averaging_s >= 0:
        raise FlexModelError("period_s must be positive and averaging_s not negative")
    final = float(np.mean(values[-max(values.size // 4, 1) :]))
    if not final > 0:
        raise FlexModelError("the meter does not move with the GPU steps")
    shares = values / final
    # The step fell uniformly in the period before sample 0: a reading `j` periods on saw it
    # between j and j + 1 periods ago, which widens the averaging by one period.
    since = period_s * np.arange(values.size, dtype=float)
    span_s = averaging_s + period_s
    horizon_s = float(since[-1])

    def residuals(params: Array) -> Array:
        dead_s, tau_s = float(params[0]), float(params[1])
        return step_share(since + period_s, dead_s, tau_s, span_s) - shares

    first = float(np.argmax(shares >= 0.5)) * period_s
    start = np.array([max(first - period_s, 0.0), max(period_s, 0.3 * first)])
    # Half a period before zero: a sampled series can put a step's onset that early (a first-
    # order filter updated at each sample shows part of a step in the sample it arrived in).
    low = [-period_s / 2, 0.0]
    fit = least_squares(residuals, start, bounds=(low, [horizon_s, horizon_s]))
    dead_s, tau_s = max(float(fit.x[0]), 0.0), float(fit.x[1])
    dof = max(values.size - 2, 1)
    scatter = max(float(fit.fun @ fit.fun) / dof, (noise_sd / final) ** 2)
    jtj = fit.jac.T @ fit.jac
    try:
        covariance = np.linalg.inv(jtj) * scatter
        dead_err, tau_err = (float(math.sqrt(max(v, 0.0))) for v in np.diag(covariance))
    except np.linalg.LinAlgError:
        dead_err = tau_err = math.inf
    unknown = [
        name
        for name, value, err in (("dead_s", dead_s, dead_err), ("tau_s", tau_s, tau_err))
        if not err <= max(0.5 * value, period_s)
    ]
    source = "identified" if not unknown else f"not identified: {', '.join(unknown)}"
    return MeterPath(dead_s, tau_s, averaging_s, dead_err, tau_err, source)
