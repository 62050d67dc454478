"""A step of the site's static load, read at the meter beside the agents' GPU power.

For a level (a setpoint, an import limit) the loop's integral takes a static load step (a
chiller cycling) back slowly: its gain is what the meter's dead time allows (0.15-0.2 at
30 s). The static load itself is measured: the meter's reading less the overhead gain times
the agents' GPU power as the meter shows it then (each change of the GPU power through the
meter's path: dead time, lag, each reading's averaging). A step in it, flat before and after
and beyond its own noise, is a disturbance the loop can move the plan by at once
(`gateway.services.tracking`).

On a meter that reads in steps, a step is more than one and a half of them: a chiller's
step is two or more, where the truth crossing a step's edge by a few watts reads as one.

Only while the GPU power the meter shows stayed put across the step (within `GPU_STILL` of it,
at the gain): a wrong overhead gain then leaks next to nothing of the GPU's moves into the
static load, and the loop's own moves are never read as a step.
"""

from __future__ import annotations

import numpy as np

from flexmodel.meterpath import MeterPath, step_share

#: Readings the static load must hold after a step before it is believed.
AFTER_READINGS = 3
#: A step is at least this share of the reduction asked at the meter (less is the integral's).
STEP_FLOOR_SHARE = 0.03
#: On a meter that reads in steps (`MeterFeed.step_kw`), a step is more than this many of
#: them: one step of the readings is a true change anywhere from none to two.
METER_STEPS = 1.5
#: A step is this many standard deviations of the two means' difference, at least.
STEP_SIGMAS = 4.0
#: Readings flat: each within this many standard deviations of their median.
FLAT_SIGMAS = 3.0
#: The GPU power shown moved less than this share of the step (at the gain) across it.
GPU_STILL = 0.25
#: A feed-forward's answer on the GPU power is read when it moved at least this share of it.
FED_ANSWER_SHARE = 0.25
_MAD_TO_SD = 1.4826


def shown_gpu_kw(
    sample_s: np.ndarray, gpu_kw: np.ndarray, reading_s: np.ndarray, path: MeterPath
) -> np.ndarray:
    """The agents' GPU power (`gpu_kw`, read at `sample_s`) as the meter shows it at each of
    `reading_s` [kW]: each of its changes through the meter's path."""
    changes = np.diff(gpu_kw)
    since = (reading_s[:, None] - sample_s[None, 1:]).ravel()
    shares = step_share(since, path.dead_s, path.tau_s, path.averaging_s)
    return np.asarray(gpu_kw[0] + shares.reshape(reading_s.size, changes.size) @ changes)


def static_step_kw(
    static_kw: np.ndarray,
    shown_kw: np.ndarray,
    before: int,
    gain: float,
    floors_kw: tuple[float, float],
) -> float:
    """The static load's step [kW] between `before` readings and the last `AFTER_READINGS`
    of `static_kw` (0: none): both flat, apart beyond `STEP_SIGMAS` of the series' own
    noise (at least the first of `floors_kw`) and beyond the second, and the GPU power shown
    (`shown_kw`, times `gain`) still."""
    after = AFTER_READINGS
    if static_kw.size < before + after or before < 2:
        return 0.0
    changes = np.diff(static_kw)
    spread = _MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))
    noise = max(spread / np.sqrt(2.0), floors_kw[0])
    first, last = static_kw[-before - after : -after], static_kw[-after:]
    if not (_flat(first, noise) and _flat(last, noise)):
        return 0.0
    step = float(np.mean(last) - np.mean(first))
    if abs(step) <= max(STEP_SIGMAS * noise * np.sqrt(1 / before + 1 / after), floors_kw[1]):
        return 0.0
    gpu = shown_kw[-before - after :]
    if gain * float(np.ptp(gpu)) > GPU_STILL * abs(step):
        return 0.0
    return step


def gpu_step_kw(
    gpu_kw: np.ndarray, before: int, ramp: int, floors_kw: tuple[float, float]
) -> float:
    """A step of the agents' GPU power itself [kW] between `before` readings and the last
    `AFTER_READINGS` of `gpu_kw`, the `ramp` readings between them aside (each reading is a
    mean over seconds: those show the step in part), by the same test as the static load's
    (0: none): a job that started, ended or drifted, where no plan moved the caps."""
    after = AFTER_READINGS
    if gpu_kw.size < before + ramp + after:
        return 0.0
    kept = np.concatenate(
        [gpu_kw[-before - ramp - after : gpu_kw.size - ramp - after], gpu_kw[-after:]]
    )
    return static_step_kw(kept, np.zeros_like(kept), before, 0.0, floors_kw)


def _flat(readings: np.ndarray, noise_kw: float) -> bool:
    return bool(np.max(np.abs(readings - np.median(readings))) <= FLAT_SIGMAS * noise_kw)
