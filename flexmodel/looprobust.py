"""The site loop's gain, from the meter path it has and how well that path is known.

docs/model.md, section 3, "The site loop's gain".

The site loop (`gateway.services.tracking`) integrates the meter's error once a period `h`,
with a Smith predictor that removes the response its own plans should have had by its model
`P0` of the meter path (dead time, lag, the loop's averaging window `W`). What goes round the
loop is then only the model's error, `P - P0 = P0 * D`, with the relative error

    D(w) = (1 + g) exp(-i w d) (1 + i w tau0) / (1 + i w tau) - 1

for a gain error `g`, a dead-time error `d` and a true time constant `tau`. The nominal loop
`c[n+1] = c[n] - k e[n]` has the response `T(z) = k / (z - 1 + k)`; by the small-gain theorem
it stays stable for every error in the box when, at every frequency up to Nyquist,

    M(w) = |T(e^{i w h})| |W(w)| |D(w)| / |1 + i w tau0|  <  1,

and keeps a modulus margin (overshoot well under 10%) when `M <= margin` (0.5 by default).
`robust_gain` is the largest `k` up to the configured one that meets it over the corners of
the box: `g = +-gain_error`, `d = +-sigmas` standard errors of the dead time, `tau` within
`sigmas` standard errors. A dead time known only to +-d caps the gain near `h / (2 d)`: the
loop waits for what it cannot predict instead of ringing on it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

#: A configured or unidentified parameter is taken as wrong by this share of its value, plus
#: half a sample period (the sampling's own uncertainty).
CONFIGURED_ERROR = 0.25
_FREQUENCIES = 256


def parameter_error(value: float, stderr: float | None, period_s: float) -> float:
    """One standard error to plan with: the fit's, or the stated default for a configured or
    unidentified value [s]."""
    if stderr is not None and math.isfinite(stderr):
        return stderr
    return CONFIGURED_ERROR * value + period_s / 2


def worst_loop_gain(
    k: float,
    *,
    period_s: float,
    window_s: float,
    tau_s: float,
    dead_error_s: float,
    tau_error_s: float,
    gain_error: float,
) -> float:
    """`max_w M(w)` at gain `k` over the corners of the error box (see the module)."""
    w = np.geomspace(1e-4 / period_s, math.pi / period_s, _FREQUENCIES)
    z = np.exp(1j * w * period_s)
    nominal = np.abs(k / (z - 1.0 + k))
    readings = max(round(window_s / period_s), 1)
    half = w * period_s / 2.0
    window = np.abs(np.sin(readings * half) / (readings * np.sin(half)))
    lagged = 1.0 / np.abs(1.0 + 1j * w * tau_s)
    worst = 0.0
    taus = {max(tau_s - tau_error_s, 0.0), tau_s + tau_error_s}
    for g, d, tau in itertools.product((-gain_error, gain_error), (-1, 1), taus):
        error = (1 + g) * np.exp(-1j * w * d * dead_error_s) * (1 + 1j * w * tau_s)
        error = error / (1 + 1j * w * tau) - 1.0
        worst = max(worst, float(np.max(nominal * window * np.abs(error) * lagged)))
    return worst


def robust_gain(
    most: float,
    *,
    period_s: float,
    window_s: float,
    tau_s: float,
    dead_error_s: float,
    tau_error_s: float,
    gain_error: float,
    margin: float = 0.5,
) -> float:
    """The largest integral gain per sample, at most `most`, whose loop keeps `M <= margin`
    for every error in the box (0 when even a vanishing gain cannot: a gain error of 100%
    or more)."""
    box = {
        "period_s": period_s,
        "window_s": window_s,
        "tau_s": tau_s,
        "dead_error_s": dead_error_s,
        "tau_error_s": tau_error_s,
        "gain_error": gain_error,
    }
    if worst_loop_gain(most, **box) <= margin:
        return most
    low, high = 0.0, most
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if worst_loop_gain(middle, **box) <= margin else (low, middle)
    return low
