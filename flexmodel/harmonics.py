"""A two-level waveform's harmonics and the exact two-job criterion summed over all of them
(docs/sync.md).

`harmonic_power` is `|c_m|^2 = sin(pi*m*d)^2 / (pi*m)^2`, the power of harmonic `m` of a
waveform with compute share `d`.

**Exact two-job criterion** over all harmonics: in phase is stable iff
`S = -sum_m m |c_m|^2 Im H(i m w) < 0`. In time, `S` is the loop's impulse response `h`
integrated against `g(w t) = sum_m m |c_m|^2 sin(m w t)`, minus half the derivative of the
pulse's autocorrelation: a step function of `theta mod 2*pi`, `+1/(4 pi)` below `2 pi d`,
`-1/(4 pi)` above `2 pi (1 - d)`, both where they overlap. The proportional part of `h` is
the delay smeared by the window and the hold (`g` averaged over them); the integral part is
a step, so it integrates `g` once more (the triangle of the autocorrelation). So `S` is
exact, and the neutral band of a proportional loop (`d' T < tau < (1 - d') T`,
`d' = min(d, 1 - d)`) comes out exactly 0: neutral, not stable.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import Array
from flexmodel.loopresponse import ClosedLoopResponse, LoopResponse

#: Harmonics summed in a closed loop's two-job criterion (its response falls off as a low
#: pass, so the sum converges well before; the sampled loop's aliases are not followed).
CLOSED_LOOP_HARMONICS = 64


def harmonic_power(m: ArrayLike, duty: ArrayLike) -> Array:
    """`|c_m|^2` of a two-level waveform with compute share `duty`."""
    m = np.asarray(m, dtype=float)
    return np.asarray(np.sin(np.pi * m * np.asarray(duty)) ** 2 / (np.pi * m) ** 2, dtype=float)


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
