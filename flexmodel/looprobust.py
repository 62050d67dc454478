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

and keeps a modulus margin (no ringing) when `M <= margin` (0.5 by default). A path wrong in
its dead time still overshoots while the loop waits for a late response; the rule bounds the
ringing, identification the overshoot.
`robust_gain` is the largest `k` up to the configured one that meets it over the corners of
the box: `g = +-gain_error`, `d = +-sigmas` standard errors of the dead time, `tau` within
`sigmas` standard errors. A dead time known only to +-d caps the gain near `h / (2 d)`: the
loop waits for what it cannot predict instead of ringing on it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

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


@dataclass(frozen=True)
class SiteLoop:
    """The loop and what it may be wrong about: its sample period, window and the meter path's
    time constant [s], and the errors to be robust to (dead time and time constant [s], the
    model's gain as a share)."""

    period_s: float
    window_s: float
    tau_s: float
    dead_error_s: float
    tau_error_s: float
    gain_error: float


def worst_loop_gain(k: float, loop: SiteLoop) -> float:
    """`max_w M(w)` at gain `k` over the corners of the error box (see the module)."""
    h, tau_s = loop.period_s, loop.tau_s
    w = np.geomspace(1e-4 / h, math.pi / h, _FREQUENCIES)
    nominal = np.abs(k / (np.exp(1j * w * h) - 1.0 + k))
    readings = max(round(loop.window_s / h), 1)
    half = w * h / 2.0
    window = np.abs(np.sin(readings * half) / (readings * np.sin(half)))
    lagged = 1.0 / np.abs(1.0 + 1j * w * tau_s)
    worst = 0.0
    taus = {max(tau_s - loop.tau_error_s, 0.0), tau_s + loop.tau_error_s}
    gains = (-loop.gain_error, loop.gain_error)
    for g, d, tau in itertools.product(gains, (-loop.dead_error_s, loop.dead_error_s), taus):
        error = (1 + g) * np.exp(-1j * w * d) * (1 + 1j * w * tau_s) / (1 + 1j * w * tau) - 1.0
        worst = max(worst, float(np.max(nominal * window * np.abs(error) * lagged)))
    return worst


def robust_gain(most: float, loop: SiteLoop, margin: float = 0.5) -> float:
    """The largest integral gain per sample, at most `most`, whose loop keeps `M <= margin`
    for every error in the box (0 when even a vanishing gain cannot: a gain error of 100%
    or more)."""
    if worst_loop_gain(most, loop) <= margin:
        return most
    low, high = 0.0, most
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if worst_loop_gain(middle, loop) <= margin else (low, middle)
    return low
