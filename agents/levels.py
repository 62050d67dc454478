"""Each job's points per cap level seen: (cap, mean power, relative throughput) with errors.

The sampler hands over, per job, its power trace and its cap at every sample (the lowest
enforced limit of its GPUs: a synchronous job runs at its slowest GPU's pace). A stretch at one
cap, less its first `SETTLE_S` (the iteration under way when the cap moved), gives the job's
iteration period there (`flexmodel.phases.estimate_waveform`) and its mean power over whole
periods. Throughput relative to the reference level (the highest cap seen: the uncapped run
once the job has run at its GPUs' limit) is `T_ref / T`: a capped iteration does the same work
in longer time. Each level keeps the stretch that covered the most periods, so a level outlives
the sample window. A stretch with no clear period gives its mean power and why it has no
period, never an invented one.

Every stretch is kept too, the last `MAX_STRETCHES` of them, each with when it was measured
(`CapPoint.start_s`, `end_s`): a probe returns to the uncapped level between and after its
capped ones, and the gateway measures the job's drift from those repeats (`stretches`).
A run at one cap longer than the sample window stays one stretch as the window slides.

Each stretch gives the job's SM clock too, where the GPUs' clocks were read: its mean over the
whole periods and its mean in the compute phase (`compute_sm_clock_mhz`: the samples above the
midpoint of the two power levels, less one sample either side of each edge, where a reading
may straddle the phases), the clock a cap lowers.

Errors: the mean power's from the spread of per-period means; the period's from the two
halves of the stretch measured apart (half their difference), at least the resolution of the
sampling over the stretch (twice that when the stretch is too short to halve); the relative
throughput's from both periods' (first order).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.protocol import CapPoint
from flexmodel.errors import FlexModelError
from flexmodel.phases import estimate_waveform

#: The start of a stretch at a new cap that is not measured: the iteration under way then.
SETTLE_S = 1.0
#: A stretch needs this many periods (at its longest candidate) to be measured.
MIN_PERIODS = 2.5
#: Two caps within this are one level [W].
CAP_RESOLUTION_W = 0.5
#: A stretch still growing is measured again once it has grown by this much [s] (the
#: gateway reads telemetry every second; each measurement is three period estimates).
REMEASURE_S = 2.0
#: Levels kept per job (the oldest measured go first).
MAX_LEVELS = 32
#: Stretches kept per job (the oldest go first): a probe's levels and their references.
MAX_STRETCHES = 24


@dataclass
class _Level:
    start: float  #: when the stretch measured began (agent monotonic) [s]
    end: float
    periods: float  #: iteration periods it covered (0 without a period)
    point: CapPoint


class CapLevels:
    """Per job, per cap level: the point measured on its longest stretch."""

    def __init__(self) -> None:
        self._levels: dict[str, dict[float, _Level]] = {}
        #: per job, every stretch measured (keyed by when it was first seen to start)
        self._stretches: dict[str, dict[float, _Level]] = {}

    def update(
        self,
        job_id: str,
        times: np.ndarray,
        trace: np.ndarray,
        caps: np.ndarray,
        dt_s: float,
        clock: np.ndarray | None = None,
    ) -> None:
        """Measure the stretches at one cap in this window (`caps` NaN where unknown; `clock`
        the job's SM clock at each sample [MHz], NaN or None where not read)."""
        levels = self._levels.setdefault(job_id, {})
        runs = self._stretches.setdefault(job_id, {})
        for start, stop, cap in _stretches(times, caps):
            t0, t1 = float(times[start]), float(times[stop - 1])
            key = _run_of(runs, cap, t0, t1, dt_s)
            seen = runs.get(key)
            growing = stop == times.size  # the stretch under way now
            if seen is not None and (seen.end == t1 or (growing and t1 - seen.end < REMEASURE_S)):
                continue  # measured already, or grown too little to measure again
            span = times[start:stop]
            found = measure(
                uniform(span, trace[start:stop], dt_s),
                dt_s,
                cap,
                None if clock is None else uniform(span, clock[start:stop], dt_s),
            )
            if found is None:
                continue
            point, periods = found
            point = point.model_copy(update={"start_s": t0, "end_s": t1})
            runs[key] = _Level(t0, t1, periods, point)
            known = levels.get(cap)
            if known is None or periods >= known.periods or known.start == t0:
                levels[cap] = _Level(t0, t1, periods, point)
        while len(levels) > MAX_LEVELS:
            del levels[min(levels, key=lambda c: levels[c].end)]
        while len(runs) > MAX_STRETCHES:
            del runs[min(runs)]

    def stretches(self, job_id: str) -> list[CapPoint]:
        """Every stretch kept for the job, oldest first (relative throughput null: their
        periods compare directly)."""
        runs = self._stretches.get(job_id, {})
        return [runs[key].point for key in sorted(runs)]

    def points(self, job_id: str) -> tuple[float | None, list[CapPoint]]:
        """(the reference cap [W], the points by cap), each with its throughput relative to
        the reference level's (None where either period is unknown)."""
        levels = self._levels.get(job_id, {})
        if not levels:
            return None, []
        reference_cap = max(levels)
        ref = levels[reference_cap].point
        out = []
        for cap in sorted(levels):
            point = levels[cap].point
            relative = stderr = None
            if point.period_s and ref.period_s:
                relative = ref.period_s / point.period_s
                stderr = relative * math.hypot(
                    (point.period_stderr_s or 0.0) / point.period_s,
                    (ref.period_stderr_s or 0.0) / ref.period_s if cap != reference_cap else 0.0,
                )
            out.append(
                point.model_copy(
                    update={"relative_throughput": relative, "relative_throughput_stderr": stderr}
                )
            )
        return reference_cap, out


def _run_of(runs: dict[float, _Level], cap: float, start: float, end: float, dt_s: float) -> float:
    """The key of the stretch that a run at `cap` measured from `start` to `end` is (it
    overlaps it: the same run grown, or with its start cut off by the sliding window, or its
    settling no longer dropped), else `start`: a new stretch."""
    for key, run in runs.items():
        if run.point.cap_w == cap and start <= run.end + 2.0 * dt_s and end >= run.start:
            return key
    return start


def _stretches(times: np.ndarray, caps: np.ndarray) -> list[tuple[int, int, float]]:
    """(first, past-last index, cap) of each run at one cap, less its settling start."""
    ok = np.isfinite(caps)
    level = np.where(ok, np.round(caps / CAP_RESOLUTION_W) * CAP_RESOLUTION_W, np.nan)
    edges = np.flatnonzero(~((level[1:] == level[:-1]) | (~ok[1:] & ~ok[:-1]))) + 1
    bounds = np.concatenate([[0], edges, [level.size]])
    out = []
    for a, b in itertools.pairwise(bounds):
        if not ok[a]:
            continue
        # A run that starts the window began before it: no settling to drop.
        first = a if a == 0 else int(np.searchsorted(times, times[a] + SETTLE_S))
        if b - first >= 16:
            out.append((first, int(b), float(level[a])))
    return out


def uniform(times: np.ndarray, trace: np.ndarray, dt_s: float) -> np.ndarray:
    """The stretch on a uniform grid of `dt_s` from its first sample, interpolated linearly
    between the samples as they were taken: a sampler thread on a loaded machine runs late by
    a good part of a sample and then catches up, and samples read at their nominal times would
    smear the waveform's edges. NaN where no sample lies within 1.5 `dt_s` (a gap)."""
    count = round(float(times[-1] - times[0]) / dt_s) + 1
    grid = times[0] + dt_s * np.arange(count)
    ok = np.isfinite(trace)
    if ok.sum() < 2:
        return np.full(count, np.nan)
    taken, values = times[ok], trace[ok]
    out: np.ndarray = np.interp(grid, taken, values)
    after = np.clip(np.searchsorted(taken, grid), 1, taken.size - 1)
    nearest = np.minimum(np.abs(grid - taken[after - 1]), np.abs(taken[after] - grid))
    out[nearest > 1.5 * dt_s] = np.nan
    return out


def measure(
    trace: np.ndarray, dt_s: float, cap_w: float, clock: np.ndarray | None = None
) -> tuple[CapPoint, float] | None:
    """The point one stretch at `cap_w` gives, and the periods it covered; None when too few
    samples are finite. `clock`: the SM clock at the same samples [MHz] (NaN where not read)."""
    ok = np.isfinite(trace)
    if ok.sum() < 16:
        return None
    span_s = trace.size * dt_s
    base: dict[str, Any] = {"cap_w": cap_w, "samples": int(ok.sum()), "span_s": span_s}
    try:
        found = estimate_waveform(trace, dt_s, max_period_s=max(span_s / MIN_PERIODS, 0.5))
    except FlexModelError as exc:
        mean = float(np.nanmean(trace))
        return CapPoint(**base, power_w=mean, no_period_reason=str(exc)), 0.0
    period = found.period_s
    periods = span_s / period
    # The mean over a whole number of periods, counted in time: blocks of a period rounded to
    # whole samples would gain or lose up to half a sample each, and the excess is at one level.
    whole = min(max(round(math.floor(periods) * period / dt_s), 1), trace.size)
    power = float(np.nanmean(trace[:whole]))
    width = max(round(period / dt_s), 1)
    blocks = trace[: (whole // width) * width].reshape(-1, width)
    means = np.array([np.nanmean(b) for b in blocks if np.isfinite(b).sum() >= width / 2])
    power_se = float(means.std(ddof=1) / math.sqrt(means.size)) if means.size >= 2 else None
    clocks = _clocks(trace, clock, whole, width, 0.5 * (found.compute_w + found.comm_w))
    return (
        CapPoint(
            **base,
            power_w=power,
            power_stderr_w=power_se,
            period_s=period,
            period_stderr_s=_period_error(trace, dt_s, period, periods),
            period_confidence=found.confidence,
            compute_w=found.compute_w,
            comm_w=found.comm_w,
            periods=periods,
            sm_clock_mhz=clocks.get("sm_clock_mhz"),
            compute_sm_clock_mhz=clocks.get("compute_sm_clock_mhz"),
            compute_sm_clock_stderr_mhz=clocks.get("compute_sm_clock_stderr_mhz"),
        ),
        periods,
    )


def _clocks(
    trace: np.ndarray, clock: np.ndarray | None, whole: int, width: int, midpoint_w: float
) -> dict[str, float | None]:
    """The stretch's mean SM clock over its whole periods and in its compute phase, with the
    latter's error from the spread of its per-period means [MHz]; none where not read."""
    if clock is None or not np.isfinite(clock[:whole]).any():
        return {}
    part, power = clock[:whole], trace[:whole]
    high = np.nan_to_num(power, nan=-np.inf) > midpoint_w
    # A sample next to an edge may read the other phase's clock: left out.
    inner = high & np.roll(high, 1) & np.roll(high, -1)
    inner[[0, -1]] = high[[0, -1]]
    ok = inner & np.isfinite(part)
    out: dict[str, float | None] = {"sm_clock_mhz": float(np.nanmean(part))}
    if ok.sum() < 2:
        return out
    out["compute_sm_clock_mhz"] = float(part[ok].mean())
    blocks = [
        part[i : i + width][ok[i : i + width]] for i in range(0, (whole // width) * width, width)
    ]
    means = np.array([b.mean() for b in blocks if b.size])
    if means.size >= 2:
        out["compute_sm_clock_stderr_mhz"] = float(means.std(ddof=1) / math.sqrt(means.size))
    return out


def _period_error(trace: np.ndarray, dt_s: float, period_s: float, periods: float) -> float:
    """Half the difference of the periods the two halves give, at least the sampling's
    resolution over the stretch (a uniform error of one sample spread over its periods)."""
    resolution = dt_s / math.sqrt(12.0) / max(periods, 1.0)
    half = trace.size // 2
    if periods < 2 * MIN_PERIODS:
        return 2.0 * resolution  # too short to halve: the resolution, with a margin
    try:
        halves = [
            estimate_waveform(
                part, dt_s, min_period_s=0.5 * period_s, max_period_s=1.5 * period_s
            ).period_s
            for part in (trace[:half], trace[half:])
        ]
    except FlexModelError:
        return 2.0 * resolution
    return max(abs(halves[0] - halves[1]) / 2.0, resolution)
