"""Phases of training jobs from their power, and whether they are locking (MODEL.md section 8).

Pure functions over sampled power; the agents call them on their ring buffers.

- `estimate_waveform`: iteration period (autocorrelation peak, refined between samples) and
  duty (share of samples above the midpoint of the two levels), robust to noise and to a cap
  that clips the compute level.
- `estimate_phase`: the phase of a job's iteration from its power (band-pass around the job's
  frequency, then the analytic signal), or `None` when the power reading is too coarse.
- `order_parameters`, `RayleighAlarm`, `phase_locking_value`: is a fleet locking?
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from scipy import signal

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError

#: A power reading averaged over `a` seconds resolves phases of jobs with periods >= 3a.
RESOLVABLE_PERIODS = 3.0
#: The Rayleigh test is useless below this many jobs; use pairwise locking values there.
MIN_JOBS_FOR_RAYLEIGH = 8


@dataclass(frozen=True)
class Waveform:
    period_s: float
    duty: float
    compute_w: float  #: the high level (the cap, when one clips it)
    comm_w: float  #: the low level


def estimate_waveform(
    power_w: ArrayLike, dt_s: float, *, min_period_s: float = 0.2, max_period_s: float = 20.0
) -> Waveform:
    """Period and duty of a two-level power trace sampled every `dt_s` seconds.

    The period is the lag of the autocorrelation's highest peak within the allowed range,
    refined by a parabola through it and its neighbours (sub-sample accuracy). The trace must
    cover at least two periods.
    """
    x = np.asarray(power_w, dtype=float)
    if x.ndim != 1 or x.size < 8 or not np.all(np.isfinite(x)):
        raise FlexModelError("a power trace needs at least 8 finite samples")
    if dt_s <= 0:
        raise FlexModelError("the sampling interval must be positive")
    low, high = np.percentile(x, [10, 90])
    if high - low <= 1e-9 * max(abs(high), 1.0):
        raise FlexModelError("the trace is flat: no iteration waveform to measure")
    # Noise from successive differences (a square wave's are zero but at its edges).
    noise = 1.4826 * float(np.median(np.abs(np.diff(x)))) / np.sqrt(2.0)
    if high - low < 4.0 * noise:
        raise FlexModelError("no two-level waveform stands above the noise (a cap may clip both)")
    centred = x - x.mean()
    n = x.size
    spectrum = np.fft.rfft(centred, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    acf /= acf[0]
    acf /= (n - np.arange(n)) / n  # unbiased: long lags average fewer products
    lo = max(math.floor(min_period_s / dt_s), 1)
    hi = min(math.ceil(max_period_s / dt_s), n // 2)
    if hi <= lo + 1:
        raise FlexModelError("the trace must cover at least two of the longest periods sought")
    window = acf[lo : hi + 1]
    peaks, _ = signal.find_peaks(window)
    if peaks.size == 0:
        raise FlexModelError("no periodic waveform found in the trace")
    # The first peak that nearly reaches the highest: harmonics' multiples come later.
    top = window[peaks].max()
    first = peaks[np.argmax(window[peaks] >= 0.8 * top)] + lo
    y0, y1, y2 = acf[first - 1], acf[first], acf[min(first + 1, n - 1)]
    bend = y0 - 2 * y1 + y2
    shift = 0.5 * (y0 - y2) / bend if bend < 0 else 0.0
    mid = 0.5 * (low + high)
    return Waveform(
        period_s=float((first + np.clip(shift, -0.5, 0.5)) * dt_s),
        duty=float(np.mean(x > mid)),
        compute_w=float(np.median(x[x > mid])),
        comm_w=float(np.median(x[x <= mid])),
    )


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
