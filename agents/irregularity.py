"""Real training jobs' irregularity for the simulated GPUs (off by default).

Real iteration loops are not square waves: each iteration's length jitters (data loading,
stragglers), the job pauses every so many iterations (evaluation, checkpoints), power drifts
slowly (temperature, clocks) and so does the pace (the data, a neighbour: `pace_drift_per_s`,
a steady relative change of the iteration rate, so of throughput). `Irregularity` describes
them; its `position` maps a job's unwrapped phase [cycles] to where in an iteration the job
is, or `None` during a pause. It is a pure function of the phase and the job's key (drawn from
its id), so every node a job spans sees the same iterations, as the GPUs of one synchronous job do.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from agents.errors import InvalidSetupError

#: An iteration's boundary moves at most this far (in iterations), so boundaries keep order.
_MAX_SHIFT = 0.45


@dataclass(frozen=True)
class Irregularity:
    jitter: float = 0.0  #: standard deviation of an iteration's length, relative (<= 0.3)
    pause_every: int = 0  #: iterations between pauses (0: no pauses)
    pause_periods: float = 0.0  #: a pause's length, in iteration periods at the present pace
    pause_w: float | None = None  #: power in a pause [W]; None: the communication level
    drift_w: float = 0.0  #: amplitude of a slow sinusoidal drift of power [W]
    drift_period_s: float = 600.0
    #: relative change of the iteration rate per second, from the backend's start [1/s]
    pace_drift_per_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 0.3:
            raise InvalidSetupError(f"jitter must be from 0 to 0.3, got {self.jitter:g}")
        if self.pause_every < 0 or self.pause_periods < 0:
            raise InvalidSetupError("pause_every and pause_periods must be at least 0")
        if self.drift_period_s <= 0:
            raise InvalidSetupError("drift_period_s must be positive")
        if not abs(self.pace_drift_per_s) <= 1e-3:
            raise InvalidSetupError(
                f"pace_drift_per_s must be within +/-0.001, got {self.pace_drift_per_s:g}"
            )

    @property
    def regular(self) -> bool:
        return not (
            self.jitter
            or (self.pause_every and self.pause_periods)
            or self.drift_w
            or self.pace_drift_per_s
        )

    def job_time(self, elapsed_s: float) -> float:
        """The time a job at its undrifted pace would take for what it does in `elapsed_s`
        seconds from the start [s]: the pace `exp(pace_drift_per_s * t)` integrated (about
        `1 + pace_drift_per_s * t` over a probe; never negative)."""
        rate = self.pace_drift_per_s
        return elapsed_s if not rate else math.expm1(rate * elapsed_s) / rate

    def drift_at(self, now: float) -> float:
        """The drift [W] at `now` [s]."""
        return self.drift_w * math.sin(2.0 * math.pi * now / self.drift_period_s)

    def position(self, key: int, phase: float) -> float | None:
        """Where in its iteration (0 to 1) a job of `key` is at unwrapped `phase` [cycles], or
        None in a pause."""
        local, first = phase, 0
        if self.pause_every and self.pause_periods:
            block = self.pause_every + self.pause_periods
            count = math.floor(phase / block)
            local = phase - count * block
            if local >= self.pause_every:
                return None
            first = count * self.pause_every
        if not self.jitter:
            return local % 1.0
        i = math.floor(local)
        for k in (i - 1, i, i + 1):
            start, end = self._boundary(key, first, k), self._boundary(key, first, k + 1)
            if start <= local < end:
                return (local - start) / (end - start)
        return local % 1.0  # unreachable: boundaries stay in order

    def _boundary(self, key: int, first: int, k: int) -> float:
        """Where iteration `k` of a block (counted from iteration `first`) starts [cycles]: each
        boundary moves by a deterministic draw, so lengths vary with standard deviation
        `jitter`. A pause's edges stay put."""
        if self.pause_every and self.pause_periods and k % self.pause_every == 0:
            return float(k)
        draw = zlib.crc32(f"{key}:{first + k}".encode()) / 2**32 - 0.5  # uniform, sd 1/sqrt(12)
        shift = self.jitter / math.sqrt(2.0) * math.sqrt(12.0) * draw
        return k + max(-_MAX_SHIFT, min(_MAX_SHIFT, shift))
