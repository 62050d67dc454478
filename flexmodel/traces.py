"""A recorded power trace analysed as the agents analyse theirs (`flexgate trace`).

Loggers (NVML, DCGM) write `(t_s, power_w)` rows at roughly even times, late by a scheduler's
whim and with samples lost. `resample_uniform` puts them on a uniform grid at the median
interval (linear interpolation; grid points inside a gap of more than `GAP_INTERVALS`
intervals stay missing, not invented), and `analyse_trace` gives the iteration period, duty,
both power levels and the phase at the last sample (`flexmodel.phases`), or says why there is
no period.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from flexmodel.curves import Array
from flexmodel.errors import FlexModelError, NoPeriodError
from flexmodel.phases import Waveform, estimate_phase, estimate_waveform, phase_at_end
from flexmodel.sensors import SensorModel

#: Fewer samples than this cannot show two periods of anything.
MIN_TRACE_SAMPLES = 32
#: A gap of more than this many median intervals is missing data.
GAP_INTERVALS = 3.0
#: The trace must cover this many of the longest periods sought.
PERIODS_COVERED = 2.5
#: The shortest period sought spans this many samples, at least.
MIN_PERIOD_SAMPLES = 4


@dataclass(frozen=True)
class TraceAnalysis:
    samples: int  #: as recorded
    span_s: float
    sample_interval_s: float  #: the uniform grid's (the median interval)
    missing_share: float  #: of the grid, in gaps
    mean_power_w: float
    waveform: Waveform | None  #: None when the trace has no clear period
    phase_rad: float | None  #: at the last sample, 0 mid-compute; None without a period
    no_period: str | None  #: why there is no period


def resample_uniform(times_s: ArrayLike, power_w: ArrayLike) -> tuple[Array, Array, float]:
    """(grid times [s], power on them [W], NaN in gaps; the grid's interval [s])."""
    t = np.asarray(times_s, dtype=float)
    p = np.asarray(power_w, dtype=float)
    if t.ndim != 1 or t.shape != p.shape:
        raise FlexModelError("times and powers must be two series of the same length")
    if t.size < MIN_TRACE_SAMPLES:
        raise FlexModelError(f"a trace needs at least {MIN_TRACE_SAMPLES} samples, got {t.size}")
    bad = np.flatnonzero(~(np.isfinite(t) & np.isfinite(p)))
    if bad.size:
        raise FlexModelError(f"sample {bad[0]}: time and power must be finite numbers")
    steps = np.diff(t)
    back = np.flatnonzero(steps <= 0)
    if back.size:
        i = int(back[0]) + 1
        raise FlexModelError(
            f"sample {i}: time {t[i]:g} s does not follow {t[i - 1]:g} s (times must increase)"
        )
    dt = float(np.median(steps))
    grid = t[0] + dt * np.arange(int(np.floor((t[-1] - t[0]) / dt + 1e-9)) + 1)
    x = np.interp(grid, t, p)
    after = np.clip(np.searchsorted(t, grid), 1, t.size - 1)
    x[(t[after] - t[after - 1]) > GAP_INTERVALS * dt] = np.nan
    return grid, x, dt


def analyse_trace(
    times_s: ArrayLike,
    power_w: ArrayLike,
    *,
    min_period_s: float | None = None,
    max_period_s: float = 60.0,
    sensor_lag_s: float = 0.0,
) -> TraceAnalysis:
    """Period, duty, levels, phase and confidence of a recorded trace (see the module).

    `min_period_s` defaults to `MIN_PERIOD_SAMPLES` intervals; the longest period sought is
    `max_period_s` or what the trace covers `PERIODS_COVERED` times, the shorter.
    `sensor_lag_s`: the power sensor's effective lag (`flexmodel.sensors`); the phase is
    corrected by the sensor's phase at the period (the readings are late).
    """
    grid, x, dt = resample_uniform(times_s, power_w)
    span = float(grid[-1] - grid[0])
    shortest = MIN_PERIOD_SAMPLES * dt if min_period_s is None else min_period_s
    longest = min(max_period_s, span / PERIODS_COVERED)
    if longest <= shortest:
        raise FlexModelError(
            f"the trace covers {span:g} s: too short to find periods of {shortest:g} s or more "
            f"(it must cover {PERIODS_COVERED:g} of them)"
        )
    valid = np.isfinite(x)
    found: Waveform | None = None
    phase_rad: float | None = None
    why: str | None = None
    try:
        found = estimate_waveform(x, dt, min_period_s=shortest, max_period_s=longest)
    except NoPeriodError as exc:
        why = str(exc)
    if found is not None:
        index = np.arange(x.size)
        filled = np.interp(index, index[valid], x[valid])
        phase = estimate_phase(filled, dt, found.period_s)
        phase_rad = None if phase is None else phase_at_end(phase, grid, found.period_s)
        if phase_rad is not None and sensor_lag_s > 0:
            sensor = SensorModel.of_lag(sensor_lag_s)
            phase_rad = sensor.corrected_phase_rad(phase_rad, found.period_s)
    return TraceAnalysis(
        samples=int(np.asarray(times_s).size),
        span_s=span,
        sample_interval_s=dt,
        missing_share=float(1.0 - valid.mean()),
        mean_power_w=float(np.mean(np.asarray(power_w, dtype=float))),
        waveform=found,
        phase_rad=phase_rad,
        no_period=why,
    )
