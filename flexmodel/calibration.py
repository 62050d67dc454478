"""Calibrating the overhead factor from the facility meter (docs/model.md, section 3).

    facility_kw(t) = static_kw + k * (h * gpu_kw)(t)

The meter sees GPU power late and smoothed: its own delay and the feed's, and cooling that
responds slowly (`h`, a unit-gain response). Regressing raw levels puts every transition off
the line and biases `k` low; so the fit works on steps (cap changes, job starts and ends):

1. steps: samples where the GPU series moves by more than its noise allows (eight standard
   deviations of a sample-to-sample change) and by more than `min_step_kw` (by default 2% of
   the median GPU power: readings repeated between updates make the noise look like none,
   and every wobble a step); steps closer than
   `settle_s + window_s` are merged into one, so each has a settled plateau on both sides;
2. per step, (dG, dF) = the mean over `window_s` after it (starting `settle_s` after the
   step) minus the mean over `window_s` before it;
3. the meter's response to a unit step, sample by sample: the cross-correlation of the GPU
   steps with the meter's moves after them. Its dead time and time constant are fitted on it
   (`flexmodel.meterpath`: `path`); it must be flat (within 1% of the step, beyond noise)
   across the post window, or the cooling had not settled and the window misses part of it;
4. k: Deming regression of dF on dG through the origin (the static load cancels), with the
   ratio of their error variances from the windows' own scatter (both series are measured);
   k_stderr from the residuals, on n - 1 degrees of freedom;
5. static_kw: the mean over all windows of (facility mean - k * GPU mean), steady state by
   construction; its standard error adds the windows' scatter and k's.

A window that starts `settle_s` after a first-order response of time constant tau misses
about exp(-settle_s / tau) of the step: five time constants bias k by under 1%, seven by 0.1%.

Data that cannot identify k (too few or too small steps, a response that has not settled, a
meter that does not follow the GPUs) gives `NotIdentifiable` with the reason; inconsistent
input (lengths, NaN, a non-positive period) raises `FlexModelError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flexmodel.errors import FlexModelError
from flexmodel.meterpath import MeterPath, fit_meter_path

Array = NDArray[np.float64]

#: A step is a sample-to-sample change beyond this many standard deviations of the noise.
STEP_SIGMAS = 8.0
#: Without a `min_step_kw`, a step moves the GPUs by at least this share of their median power.
STEP_FLOOR = 0.02
#: The most the step response may move across a post window, as a share of the step, beyond
#: its noise: a response still rising there means the windows miss part of the step.
DRIFT = 0.01
#: Median absolute deviation to standard deviation, for normal noise.
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class OverheadCalibration:
    k: float  #: overhead factor, facility kW per GPU kW
    k_stderr: float
    static_kw: float  #: facility load that does not move with the GPUs [kW]
    static_stderr_kw: float  #: [kW]
    path: MeterPath  #: how a GPU step reaches the meter: dead time, lag, averaging
    points: int  #: steps the fit used


@dataclass(frozen=True)
class NotIdentifiable:
    reason: str
    path: MeterPath | None = None  #: when it was estimated
    points: int = 0  #: steps found


@dataclass(frozen=True)
class _Steps:
    d_gpu_kw: Array
    d_facility_kw: Array
    gpu_means_kw: Array  #: every window's mean, pre and post
    facility_means_kw: Array
    gpu_var_kw2: float  #: pooled within-window variance of the samples [kW^2]
    facility_var_kw2: float
    facility_after_kw: list[Array]  #: the meter from each step to its post window's end


def fit_overhead(
    gpu_kw: ArrayLike,
    facility_kw: ArrayLike,
    *,
    period_s: float,
    window_s: float,
    settle_s: float,
    min_step_kw: float | None = None,
    min_points: int = 3,
    max_rel_stderr: float = 0.05,
    averaging_s: float = 0.0,
) -> OverheadCalibration | NotIdentifiable:
    """Fit facility kW = static + k * GPU kW on two series sampled together every `period_s`.

    gpu_kw : the GPUs' measured power, each sample a mean over at least one iteration [kW]
    facility_kw : the meter's readings at the same instants [kW]
    window_s : the mean on each side of a step [s]
    settle_s : from a GPU step to the start of its post window: the meter's lag and the
        cooling's settling (four time constants or more) [s]
    min_step_kw : smaller GPU steps are ignored, whatever the noise; None: 2% of the median
        GPU power [kW]
    max_rel_stderr : k is identified only when k_stderr / k is below this
    averaging_s : each meter reading's own averaging window, known from the meter [s]
    """
    gpu, facility = _series(gpu_kw, facility_kw)
    _check_timing(period_s, window_s, settle_s)
    if min_step_kw is None:
        min_step_kw = STEP_FLOOR * float(np.median(np.abs(gpu)))
    if min_points < 2 or not max_rel_stderr > 0 or not min_step_kw >= 0:
        raise FlexModelError("min_points >= 2, max_rel_stderr > 0 and min_step_kw >= 0")
    window, settle = round(window_s / period_s), round(settle_s / period_s)
    steps = _steps(gpu, facility, window=window, settle=settle, min_step_kw=min_step_kw)
    found = len(steps.d_gpu_kw)
    if found < min_points:
        return NotIdentifiable(
            f"{found} isolated GPU step(s) found, {min_points} needed: steps must stand out "
            f"of the noise, exceed {min_step_kw:.3g} kW (min_step_kw) and be "
            f"{settle_s + window_s:g} s apart (settle_s + window_s), with {window_s:g} s of "
            "data on each side",
            points=found,
        )
    response = step_response(steps, settle=settle, window=window)
    final = float(np.mean(response[settle:]))
    if final <= 0:
        return NotIdentifiable("the meter does not move with the GPU steps", points=found)
    path = fit_meter_path(
        response,
        period_s=period_s,
        averaging_s=averaging_s,
        noise_sd=_response_sd(steps),
    )
    k, k_stderr = _deming_fit(steps)
    why = _why_not_identified(
        steps, response[settle:], k, k_stderr, max_rel_stderr=max_rel_stderr, settle_s=settle_s
    )
    if why is not None:
        return NotIdentifiable(why, path, found)
    return OverheadCalibration(k, k_stderr, *_static_kw(steps, k, k_stderr), path, found)


def _why_not_identified(
    steps: _Steps,
    post_response: Array,
    k: float,
    k_stderr: float,
    *,
    max_rel_stderr: float,
    settle_s: float,
) -> str | None:
    """Why the fitted `k` does not stand, if it does not: its error beyond `max_rel_stderr`
    of it, a meter still moving across the post window (`post_response`, the unit-step
    response there), or a k below 1."""
    if k_stderr > max_rel_stderr * k:
        return (
            f"k = {k:.3f} +/- {k_stderr:.3f} is not identified to {max_rel_stderr:.0%}: the GPU "
            f"steps (largest {np.max(np.abs(steps.d_gpu_kw)):.3g} kW) are too small against "
            "the noise"
        )
    drift = settling_drift(steps, post_response)
    if drift > DRIFT:
        return (
            f"the meter still moves {drift:.1%} of a step across the post window: the "
            f"cooling has not settled {settle_s:g} s after a step (raise settle_s)"
        )
    if k < 1.0:
        return f"k = {k:.3f} is below 1: the meter does not see all of these GPUs"
    return None


def step_response(steps: _Steps, *, settle: int, window: int) -> Array:
    """The meter's mean response to a unit GPU step, sample by sample from the step [kW/kW]:
    a cross-correlation of the GPU steps with the meter's moves around them (least squares
    over the steps, so the large ones count most)."""
    moves = np.array([f[: settle + window] for f in steps.facility_after_kw])
    moves -= steps.facility_means_kw[0::2, None]  # from each step's pre-window mean
    d_gpu = steps.d_gpu_kw
    return np.asarray((d_gpu @ moves) / float(d_gpu @ d_gpu), dtype=float)


def _series(gpu_kw: ArrayLike, facility_kw: ArrayLike) -> tuple[Array, Array]:
    gpu, facility = np.asarray(gpu_kw, dtype=float), np.asarray(facility_kw, dtype=float)
    if gpu.ndim != 1 or gpu.shape != facility.shape:
        raise FlexModelError(
            f"the GPU and facility series must be 1-D and of one length, not {gpu.shape} "
            f"and {facility.shape}"
        )
    if not (np.all(np.isfinite(gpu)) and np.all(np.isfinite(facility))):
        raise FlexModelError("the GPU and facility series must be finite (drop missing samples)")
    return gpu, facility


def _check_timing(period_s: float, window_s: float, settle_s: float) -> None:
    if not period_s > 0 or not window_s >= 2 * period_s or not settle_s >= 0:
        raise FlexModelError(
            f"period_s ({period_s}) must be positive, window_s ({window_s}) at least two "
            f"periods and settle_s ({settle_s}) not negative"
        )


def _steps(gpu: Array, facility: Array, *, window: int, settle: int, min_step_kw: float) -> _Steps:
    change = np.diff(gpu)
    noise_sd = _MAD_TO_SD * float(np.median(np.abs(change - np.median(change))))
    threshold = max(min_step_kw, STEP_SIGMAS * noise_sd)
    moves = np.flatnonzero(np.abs(change) > threshold) + 1  # the first sample at the new level
    groups: list[list[int]] = []  # [first sample moved, first sample after the last move]
    for index in moves.tolist():
        if groups and index - groups[-1][1] < settle + window:
            groups[-1][1] = index
        else:
            groups.append([index, index])
    windows, after = [], []  # pre and post of each step, in turn; the meter from the step on
    for start, end in groups:
        pre, post = slice(start - window, start), slice(end + settle, end + settle + window)
        if pre.start >= 0 and post.stop <= len(gpu):
            windows += [pre, post]
            after.append(facility[end : post.stop])
    gpu_means = np.array([np.mean(gpu[w]) for w in windows])
    facility_means = np.array([np.mean(facility[w]) for w in windows])
    return _Steps(
        gpu_means[1::2] - gpu_means[0::2],
        facility_means[1::2] - facility_means[0::2],
        gpu_means,
        facility_means,
        float(np.mean([np.var(gpu[w], ddof=1) for w in windows])) if windows else 0.0,
        float(np.mean([np.var(facility[w], ddof=1) for w in windows])) if windows else 0.0,
        after,
    )


def deming_slope(x: Array, y: Array, ratio: float) -> float:
    """Slope through the origin when both x and y carry errors; `ratio` = var(y error) /
    var(x error) (infinite: x is exact, ordinary least squares of y on x)."""
    sxx, syy, sxy = float(x @ x), float(y @ y), float(x @ y)
    if not np.isfinite(ratio):
        return sxy / sxx
    spread = syy - ratio * sxx
    root = float(np.hypot(spread, 2.0 * np.sqrt(ratio) * sxy))
    # two forms of one root: each avoids the cancellation the other suffers
    return (spread + root) / (2.0 * sxy) if spread > 0 else 2.0 * ratio * sxy / (root - spread)


def settling_drift(steps: _Steps, post_response: Array) -> float:
    """How far the unit-step response moves from the first to the last quarter of the post
    window, as a share of it, less three standard deviations of that difference's noise."""
    quarter = max(len(post_response) // 4, 1)
    moved = float(np.mean(post_response[-quarter:]) - np.mean(post_response[:quarter]))
    noise = 3.0 * _response_sd(steps) * np.sqrt(2.0 / quarter)
    return float(max(abs(moved) - noise, 0.0) / np.mean(post_response))


def _response_sd(steps: _Steps) -> float:
    """One standard deviation of a unit-step response sample's noise [kW/kW]."""
    return float(np.sqrt(steps.facility_var_kw2 / float(steps.d_gpu_kw @ steps.d_gpu_kw)))


def _deming_fit(steps: _Steps) -> tuple[float, float]:
    """k and its standard error from the steps, errors in both variables."""
    x, y = steps.d_gpu_kw, steps.d_facility_kw
    ratio = steps.facility_var_kw2 / steps.gpu_var_kw2 if steps.gpu_var_kw2 > 0 else float("inf")
    k = deming_slope(x, y, ratio)
    # the fitted true GPU steps, and the residual scatter on n - 1 degrees of freedom
    true_x = x if not np.isfinite(ratio) else (ratio * x + k * y) / (ratio + k * k)
    residual = y - k * x
    return k, float(np.sqrt(float(residual @ residual) / (len(x) - 1) / float(true_x @ true_x)))


def _static_kw(steps: _Steps, k: float, k_stderr: float) -> tuple[float, float]:
    """The static load and its standard error [kW] from the settled windows' levels."""
    offsets = steps.facility_means_kw - k * steps.gpu_means_kw
    variance = float(np.var(offsets, ddof=1)) / len(offsets)
    variance += (float(np.mean(steps.gpu_means_kw)) * k_stderr) ** 2
    return float(np.mean(offsets)), float(np.sqrt(variance))
