"""Phases of training jobs from their power, and whether they are locking (docs/sync.md).

Pure functions over sampled power; the agents call them on their ring buffers.

- `estimate_waveform`: iteration period (autocorrelation peak, refined between samples), duty
  (the share of the samples above the midpoint of the two levels) and both levels (the
  two-medians split of the samples, started from Otsu's), with a confidence; robust to
  noise, slow drift, missing samples, pauses and a cap that clips the compute level, and
  `NoPeriodError` for a trace that does not repeat.
- `estimate_phase`: the phase of a job's iteration from its power (band-pass around the job's
  frequency, then the analytic signal), or `None` when the power reading is too coarse.
- `order_parameters`, `RayleighAlarm`, `phase_locking_value`: is a fleet locking?
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import ndimage, signal

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError, NoPeriodError

#: A power reading averaged over `a` seconds resolves phases of jobs with periods >= 3a.
RESOLVABLE_PERIODS = 3.0
#: The Rayleigh test is useless below this many jobs; use pairwise locking values there.
MIN_JOBS_FOR_RAYLEIGH = 8


#: The autocorrelation at a period (1: every iteration alike) must reach this, and rise this
#: far above the trough before it, or the trace has no period.
MIN_PERIODICITY = 0.3
MIN_PROMINENCE = 0.3
#: A run at one level longer than this many periods is a pause (evaluation, checkpoint).
PAUSE_PERIODS = 1.5
#: Blocks of one period in the running median that follows slow drift.
DRIFT_BLOCKS = 15
#: The two levels must stand this many noise standard deviations apart.
MIN_LEVEL_SEPARATION = 4.0


@dataclass(frozen=True)
class Waveform:
    period_s: float
    duty: float
    compute_w: float  #: the high level (the cap, when one clips it)
    comm_w: float  #: the low level
    confidence: float = 1.0  #: the autocorrelation at the period: 1 when every iteration is alike
    paused_share: float = 0.0  #: share of the samples set aside as pauses


def estimate_waveform(
    power_w: ArrayLike, dt_s: float, *, min_period_s: float = 0.2, max_period_s: float = 20.0
) -> Waveform:
    """Period, duty and both levels of a two-level power trace sampled every `dt_s` seconds.

    NaN samples are missing ones. The period is the lag of the autocorrelation's first peak
    that nearly reaches the highest within the allowed range (sub-sample by a parabola).
    Slow drift is followed by a running median of one-period means and taken out. The levels
    split where the two clusters of samples are best separated (Otsu's between-class
    variance), so a low phase a few percent of the period long is found as well as a long one;
    runs at one level longer than `PAUSE_PERIODS` periods (evaluation, checkpoints) are set
    aside and the period measured again without them. Raises `NoPeriodError` when the trace is
    flat, has no two levels above its noise or does not repeat: no period is ever invented.
    """
    x = np.asarray(power_w, dtype=float)
    if x.ndim != 1:
        raise FlexModelError("a power trace must be one series of samples")
    valid = np.isfinite(x)
    if valid.sum() < 8:
        raise FlexModelError("a power trace needs at least 8 finite samples")
    if dt_s <= 0:
        raise FlexModelError("the sampling interval must be positive")
    spread = float(np.ptp(x[valid]))
    if spread <= 1e-9 * max(float(np.abs(x[valid]).max()), 1.0):
        raise NoPeriodError("the trace is flat: no iteration waveform to measure")
    lags = _lag_range(x.size, dt_s, min_period_s, max_period_s)
    straight = _remove_line(x, valid)
    first_guess = _pauses(straight > split_levels(straight[valid]), valid)
    if first_guess.mean() > 0.5:  # the runs are noise, not a waveform with pauses
        first_guess[:] = False
    lag, _ = _find_period(straight, valid & ~first_guess, lags)
    steady = x - _drift(x, valid, lag)
    pauses = _pauses(steady > split_levels(steady[valid]), valid, lag)
    kept = valid & ~pauses
    if kept.sum() < 8:
        raise NoPeriodError("pauses fill the trace: no iteration waveform to measure")
    lag, periodicity = _find_period(steady, kept, lags)
    samples = steady[kept]
    high = _midpoint_split(samples)
    compute_w, comm_w = float(np.median(samples[high])), float(np.median(samples[~high]))
    noise = _noise(steady, kept)
    if compute_w - comm_w < MIN_LEVEL_SEPARATION * noise:
        raise NoPeriodError(
            f"no two-level waveform stands above the noise ({compute_w - comm_w:.3g} W between "
            f"the levels, noise {noise:.3g} W; a cap may clip both)"
        )
    return Waveform(
        period_s=float(lag * dt_s),
        duty=float(np.mean(high)),
        compute_w=compute_w,
        comm_w=comm_w,
        confidence=float(np.clip(periodicity, 0.0, 1.0)),
        paused_share=float(np.mean(pauses[valid])),
    )


#: The midpoint split stops after this many moves (it settles in two or three).
MIDPOINT_ITERATIONS = 20
#: The levels' extremes the midpoint split starts from: these percentiles of the samples (a low
#: phase under 1% of the period is then missed: such a trace has no two levels to speak of).
EXTREME_PERCENT = 1.0


def _midpoint_split(samples: Array) -> NDArray[np.bool_]:
    """The samples above the midpoint of the two levels: the midpoint of the two clusters'
    medians, moved until the clusters no longer change (two-medians), started from Otsu's
    threshold and from the midpoint of the extremes (robust percentiles); of the two, the
    split whose levels stand furthest apart against their spread (median absolute deviations).

    The duty is the share of the period above that midpoint: a slow edge then counts for each
    level what its half of the ramp lasts, whatever the ramp's length. Otsu's threshold alone
    is pulled inside a high level that wanders widely or has two sub-levels (real compute
    phases do), which read 0.85 for a duty of 0.90 on real slow-edged traces; the extremes'
    midpoint alone is pulled inside a noisy high level when the low one is short."""
    lo_w, hi_w = np.percentile(samples, [EXTREME_PERCENT, 100.0 - EXTREME_PERCENT])
    best, best_score = None, -math.inf
    for start in (split_levels(samples), 0.5 * (float(lo_w) + float(hi_w))):
        high = _two_medians(samples, samples > start)
        if high.all() or not high.any():
            continue
        up, down = samples[high], samples[~high]
        spread = float(
            np.median(np.abs(up - np.median(up))) + np.median(np.abs(down - np.median(down)))
        )
        score = (float(np.median(up)) - float(np.median(down))) / max(spread, 1e-12)
        if score > best_score:
            best, best_score = high, score
    if best is None:
        raise NoPeriodError("one level only: no split into two")
    return best


def _two_medians(samples: Array, high: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Split at the midpoint of the two sides' medians until the sides no longer change."""
    for _ in range(MIDPOINT_ITERATIONS):
        if high.all() or not high.any():
            break
        mid = 0.5 * (float(np.median(samples[high])) + float(np.median(samples[~high])))
        moved = samples > mid
        if np.array_equal(moved, high):
            break
        high = moved
    return high


def split_levels(samples: ArrayLike) -> float:
    """The power [W] that best splits samples into two clusters: the threshold maximising the
    between-class variance (Otsu). Unlike percentiles it does not need either level to hold a
    given share of the samples."""
    v = np.sort(np.asarray(samples, dtype=float))
    if v.size < 2 or v[0] == v[-1]:
        raise NoPeriodError("one level only: no split into two")
    total = np.cumsum(v)
    k = np.arange(1, v.size)
    low_mean = total[:-1] / k
    high_mean = (total[-1] - total[:-1]) / (v.size - k)
    between = k * (v.size - k) * (high_mean - low_mean) ** 2
    best = int(np.argmax(np.where(v[1:] > v[:-1], between, -1.0)))
    return float(0.5 * (v[best] + v[best + 1]))


def _lag_range(n: int, dt_s: float, min_period_s: float, max_period_s: float) -> tuple[int, int]:
    lo = max(math.floor(min_period_s / dt_s), 1)
    hi = min(math.ceil(max_period_s / dt_s), n // 2)
    if hi <= lo + 1:
        raise FlexModelError("the trace must cover at least two of the longest periods sought")
    return lo, hi


def _autocorrelation(x: Array, valid: NDArray[np.bool_]) -> Array:
    """Normalised autocorrelation over the valid samples only (missing ones and pauses out),
    each lag averaged over the pairs it has."""
    n = x.size
    centred = np.where(valid, x - x[valid].mean(), 0.0)
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(centred, size)
    weights = np.fft.rfft(valid.astype(float), size)
    products = np.fft.irfft(spectrum * np.conj(spectrum), size)[:n]
    pairs = np.rint(np.fft.irfft(weights * np.conj(weights), size)[:n])
    with np.errstate(divide="ignore", invalid="ignore"):
        acf = np.where(pairs > 0, products / pairs, 0.0)
    return np.asarray(acf / acf[0], dtype=float)


def _find_period(x: Array, valid: NDArray[np.bool_], lags: tuple[int, int]) -> tuple[float, float]:
    """(period [samples, fractional], autocorrelation there); `NoPeriodError` when no peak
    is high and prominent enough."""
    acf = _autocorrelation(x, valid)
    lo, hi = lags
    window = acf[lo : hi + 1]
    peaks, _ = signal.find_peaks(window, prominence=MIN_PROMINENCE)
    peaks = peaks[window[peaks] >= MIN_PERIODICITY]
    if peaks.size == 0:
        best = float(window.max()) if window.size else 0.0
        raise NoPeriodError(
            f"no clear iteration period: the power does not repeat (autocorrelation at most "
            f"{best:.2f} with no peak standing {MIN_PROMINENCE:g} above its trough)"
        )
    # The first peak that nearly reaches the highest: harmonics' multiples come later.
    top = window[peaks].max()
    first = int(peaks[np.argmax(window[peaks] >= 0.8 * top)] + lo)
    y0, y1, y2 = acf[first - 1], acf[first], acf[min(first + 1, acf.size - 1)]
    bend = y0 - 2 * y1 + y2
    shift = 0.5 * (y0 - y2) / bend if bend < 0 else 0.0
    return first + float(np.clip(shift, -0.5, 0.5)), float(y1)


def _remove_line(x: Array, valid: NDArray[np.bool_]) -> Array:
    """`x` less its straight-line trend (fitted on the valid samples)."""
    index = np.arange(x.size, dtype=float)
    slope, intercept = np.polyfit(index[valid], x[valid], 1)
    return np.asarray(x - (slope * index + intercept), dtype=float)


def _drift(x: Array, valid: NDArray[np.bool_], lag: float) -> Array:
    """Slow drift [W, mean 0] at every sample: means over whole periods hold no waveform, and
    their running median over `DRIFT_BLOCKS` periods is robust to the pauses among them."""
    width = max(round(lag), 1)
    blocks = x.size // width
    if blocks < 3:
        return np.zeros_like(x)
    shaped = np.where(valid, x, np.nan)[: blocks * width].reshape(blocks, width)
    enough = np.isfinite(shaped).sum(axis=1) >= width / 2
    means = np.full(blocks, np.nan)
    means[enough] = np.nanmean(shaped[enough], axis=1)
    half = DRIFT_BLOCKS // 2
    padded = np.pad(means, half, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window of missing blocks
        smooth = np.nanmedian(windows, axis=1)
    ok = np.isfinite(smooth)
    if ok.sum() < 2:
        return np.zeros_like(x)
    centres = (np.arange(blocks) + 0.5) * width
    drift = np.interp(np.arange(x.size), centres[ok], smooth[ok])
    return np.asarray(drift - drift[valid].mean(), dtype=float)


def _pauses(
    high: NDArray[np.bool_], valid: NDArray[np.bool_], lag: float | None = None
) -> NDArray[np.bool_]:
    """Samples in runs at one level longer than `PAUSE_PERIODS` periods of `lag` samples.

    Without a period, the typical iteration is the median high run plus the median low run:
    pauses are too rare to move a median. A run is cut where a gap in the samples longer
    than a tenth of a period hides what happened (a phase may have been lost in it).
    """
    index = np.flatnonzero(valid)
    labels = ndimage.median_filter(high[index].astype(np.uint8), size=3, mode="nearest")
    gap = max(3.0, 0.1 * lag) if lag is not None else 3.0
    edges = np.flatnonzero((np.diff(labels) != 0) | (np.diff(index) > gap)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [labels.size]]) - 1
    lengths = index[ends] - index[starts] + 1
    if lag is None:
        levels = labels[starts]
        if levels.min() == levels.max():
            return np.zeros(high.shape, dtype=bool)
        lag = float(np.median(lengths[levels == 1]) + np.median(lengths[levels == 0]))
    out = np.zeros(high.shape, dtype=bool)
    for a, b, length in zip(starts, ends, lengths, strict=True):
        if length > PAUSE_PERIODS * lag:
            out[index[a] : index[b] + 1] = True
    return out & valid


def _noise(x: Array, valid: NDArray[np.bool_]) -> float:
    """Sample noise [W] from successive differences (a square wave's are zero but at edges)."""
    pairs = valid[1:] & valid[:-1]
    if not pairs.any():
        return 0.0
    return 1.4826 * float(np.median(np.abs(np.diff(x)[pairs]))) / math.sqrt(2.0)


def phase_resolvable(period_s: float, averaging_s: float) -> bool:
    """Whether a reading averaged over `averaging_s` can give this job's phase."""
    return period_s >= RESOLVABLE_PERIODS * averaging_s


def estimate_phase(
    power_w: ArrayLike, dt_s: float, period_s: float, *, averaging_s: float = 0.0
) -> Array | None:
    """Unwrapped phase [rad] at every sample: band-pass around `1/period_s`, analytic signal.

    Phase 0 is where the fundamental of the power peaks (mid-compute). `None` when the reading
    (averaged over `averaging_s`) is too coarse for the period: say so, don't guess.
    """
    if not phase_resolvable(period_s, max(averaging_s, 2 * dt_s)):
        return None
    x = np.asarray(power_w, dtype=float)
    f0, nyquist = 1.0 / period_s, 0.5 / dt_s
    band = (0.6 * f0 / nyquist, min(1.5 * f0 / nyquist, 0.99))
    if band[0] >= band[1]:
        return None
    sos = signal.butter(2, band, btype="bandpass", output="sos")
    if x.size <= 3 * 2 * len(sos) + 1:
        raise FlexModelError("the trace is too short for the band-pass filter")
    smooth = signal.sosfiltfilt(sos, x - x.mean())
    return np.asarray(np.unwrap(np.angle(signal.hilbert(smooth))), dtype=float)


def phase_at_end(phase_rad: ArrayLike, times_s: ArrayLike, period_s: float) -> float:
    """The phase [rad, 0 to 2 pi] at the last sample, from the whole trace: the filtered
    phase (`estimate_phase`) is biased near the trace's ends, so its offset from `2 pi t / T`
    is averaged over the samples a period away from either end and carried to the last one."""
    phi = np.asarray(phase_rad, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if phi.shape != t.shape or phi.size == 0:
        raise FlexModelError("phases and times must have the same, non-zero length")
    w = 2.0 * np.pi / period_s
    inner = (t >= t[0] + period_s) & (t <= t[-1] - period_s)
    keep = inner if inner.sum() >= 4 else np.ones_like(inner)
    offset = np.angle(np.exp(1j * (phi[keep] - w * t[keep])).mean())
    return float(np.mod(offset + w * t[-1], 2.0 * np.pi))


def order_parameters(phases_rad: ArrayLike, harmonics: tuple[int, ...] = (1, 2, 3)) -> Array:
    """`r_m = |mean_j exp(i m phi_j)|` for each harmonic (over the last axis)."""
    phi = np.asarray(phases_rad, dtype=float)
    return np.stack([np.abs(np.exp(1j * m * phi).mean(axis=-1)) for m in harmonics], axis=-1)


def rayleigh_threshold(jobs: int, false_alarm: float = 0.01, harmonics: int = 3) -> float:
    """`r_m` above which N random phases are locked, at `false_alarm` split over harmonics."""
    return math.sqrt(math.log(harmonics / false_alarm) / jobs)


@dataclass
class RayleighAlarm:
    """Raises an alarm per harmonic once `r_m` stays above the Rayleigh threshold for
    `hold` consecutive windows, and clears it at the first window below."""

    false_alarm: float = 0.01
    hold: int = 3
    streak: list[int] = field(default_factory=lambda: [0, 0, 0])

    def update(self, phases_rad: ArrayLike) -> list[bool]:
        phi = np.asarray(phases_rad, dtype=float)
        if phi.size < MIN_JOBS_FOR_RAYLEIGH:
            raise FlexModelError(
                f"the Rayleigh test needs {MIN_JOBS_FOR_RAYLEIGH} jobs or more; use "
                "phase_locking_value for fewer"
            )
        limit = rayleigh_threshold(phi.size, self.false_alarm)
        r = order_parameters(phi)
        self.streak = [
            s + 1 if above else 0 for s, above in zip(self.streak, r > limit, strict=True)
        ]
        return [s >= self.hold for s in self.streak]


def phase_locking_value(phase_a: ArrayLike, phase_b: ArrayLike) -> float:
    """`|mean_t exp(i (phi_a - phi_b))|`: 1 when two jobs keep a fixed phase difference."""
    a, b = np.asarray(phase_a, dtype=float), np.asarray(phase_b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise FlexModelError("phase series must have the same, non-zero length")
    return float(np.abs(np.exp(1j * (a - b)).mean()))
