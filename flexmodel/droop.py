"""The droop path's phase against the grid's inter-area modes (docs/fast.md, "Safety").

A droop reduces the site's power in proportion to the frequency's fall: `gain_mw_per_hz`
[MW/Hz], full depth at the trip frequency, nothing inside the dead band. The grid answers the
site's power with a frequency change, `stiffness_hz_per_mw` [Hz/MW] (quasi-static), so the
droop closes a loop of gain `gain * stiffness` (dimensionless) through the grid. On a large
interconnection that gain is tiny; the risk is the loop's delay (measurement, trigger,
actuation: `delay_s`): a feedback that lags a mode by `360 f delay` degrees adds damping to it
in proportion to the cosine of that lag, and takes damping away beyond 90 degrees. Inter-area
modes lie between 0.1 and 1 Hz. `droop_report` gives the lag and the damping's sign across
that band, and refuses (`DroopRefusedError`) a delay whose worst lag exceeds the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexmodel.errors import FlexModelError

#: The inter-area modes' band [Hz].
INTER_AREA_BAND_HZ = (0.1, 1.0)
DEFAULT_PHASE_BOUND_DEG = 90.0


class DroopRefusedError(FlexModelError):
    """A droop configuration whose delay lags the inter-area modes beyond the bound."""


@dataclass(frozen=True)
class DroopReport:
    delay_s: float
    loop_gain: float  #: gain x stiffness: the droop's share of the grid's own response
    freqs_hz: tuple[float, ...]
    phase_lag_deg: tuple[float, ...]  #: the droop's lag at each frequency [deg]
    damping_sign: tuple[float, ...]  #: cos(lag): above 0 the droop damps the mode
    worst_phase_lag_deg: float
    bound_deg: float
    max_delay_s: float  #: the longest delay within the bound across the band [s]


def droop_report(
    delay_s: float,
    stiffness_hz_per_mw: float,
    gain_mw_per_hz: float,
    *,
    bound_deg: float = DEFAULT_PHASE_BOUND_DEG,
    band_hz: tuple[float, float] = INTER_AREA_BAND_HZ,
    points: int = 10,
) -> DroopReport:
    """The droop path's lag across `band_hz` (`points` frequencies, ends included);
    `DroopRefusedError` when its worst lag exceeds `bound_deg`, `FlexModelError` for inputs
    that are not finite, negative, or a band or bound that is empty."""
    for name, value in (
        ("delay_s", delay_s),
        ("stiffness_hz_per_mw", stiffness_hz_per_mw),
        ("gain_mw_per_hz", gain_mw_per_hz),
    ):
        if not math.isfinite(value) or value < 0.0:
            raise FlexModelError(f"{name} must be finite and not negative, got {value!r}")
    low, high = band_hz
    if not 0.0 < low < high or not 0.0 < bound_deg <= 180.0 or points < 2:
        raise FlexModelError(
            f"band_hz {band_hz!r} must rise from above 0, bound_deg {bound_deg!r} lie in "
            f"(0, 180], points {points!r} be 2 or more"
        )
    freqs = tuple(low + (high - low) * k / (points - 1) for k in range(points))
    lags = tuple(360.0 * f * delay_s for f in freqs)
    report = DroopReport(
        delay_s=delay_s,
        loop_gain=gain_mw_per_hz * stiffness_hz_per_mw,
        freqs_hz=freqs,
        phase_lag_deg=lags,
        damping_sign=tuple(math.cos(math.radians(lag)) for lag in lags),
        worst_phase_lag_deg=max(lags),
        bound_deg=bound_deg,
        max_delay_s=bound_deg / (360.0 * high),
    )
    if report.worst_phase_lag_deg > bound_deg:
        raise DroopRefusedError(
            f"a droop delayed {delay_s:g} s lags a {high:g} Hz inter-area mode by "
            f"{report.worst_phase_lag_deg:.0f} degrees, beyond the {bound_deg:g} allowed: "
            f"at most {report.max_delay_s:.3g} s"
        )
    return report
