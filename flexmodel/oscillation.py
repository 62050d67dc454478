"""The site power's oscillation: its swing at the fleet's periods and its energy in a band, as
grid rules watch a large load (docs/sync.md, "The site's oscillation")."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.errors import FlexModelError

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
