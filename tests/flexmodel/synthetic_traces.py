"""Synthetic GPU power traces with the irregularity of real training jobs, for the estimator's
tests: a two-level loop whose iterations jitter, with periodic pauses (evaluation,
checkpoints), slow drift, noise, missing and unevenly spaced samples. Generated, not recorded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Loop:
    period_s: float = 6.7
    duty: float = 6.2 / 6.7  #: compute share of an iteration
    compute_w: float = 116.0
    comm_w: float = 51.0
    jitter: float = 0.0  #: standard deviation of an iteration's length, relative
    pause_every: int = 0  #: iterations between pauses (0: none)
    pause_s: float = 0.0
    pause_w: float = 51.0
    drift_w: float = 0.0  #: amplitude of a slow sinusoidal drift [W]
    drift_period_s: float = 900.0
    noise_w: float = 1.0


def power_at(loop: Loop, t: np.ndarray, seed: int = 0) -> np.ndarray:
    """The loop's power [W] at times `t` [s] (ascending), with its noise."""
    rng = np.random.default_rng(seed)
    count = int(t[-1] / (loop.period_s * max(1 - 4 * loop.jitter, 0.2))) + 2
    lengths = loop.period_s * np.clip(1 + loop.jitter * rng.standard_normal(count), 0.2, None)
    starts = np.concatenate([[0.0], np.cumsum(lengths)])  # iteration starts, without pauses
    if loop.pause_every:
        paused = np.arange(starts.size) // loop.pause_every * loop.pause_s
        starts = starts + paused
    k = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, count - 1)
    into = t - starts[k]
    length = lengths[k]
    power = np.where(into < loop.duty * length, loop.compute_w, loop.comm_w)
    power = np.where(into >= length, loop.pause_w, power)  # the pause after an iteration
    power = power + loop.drift_w * np.sin(2 * np.pi * t / loop.drift_period_s)
    return np.asarray(power + rng.normal(0.0, loop.noise_w, t.size), dtype=float)


def uniform_times(seconds: float, hz: float) -> np.ndarray:
    return np.arange(0.0, seconds, 1.0 / hz)


def uneven_times(seconds: float, hz: float, *, drop: float = 0.1, seed: int = 0) -> np.ndarray:
    """Sampling times of a logger that wakes late and loses samples: spacing jitters by a third
    of the interval, `drop` of the samples are lost, and one gap of two seconds."""
    rng = np.random.default_rng(seed + 1)
    dt = 1.0 / hz
    t = np.arange(0.0, seconds, dt) + rng.uniform(0.0, dt / 3, int(np.ceil(seconds * hz)))
    keep = rng.uniform(size=t.size) >= drop
    gap = (t > seconds / 3) & (t < seconds / 3 + 2.0)
    return np.sort(t[keep & ~gap])
