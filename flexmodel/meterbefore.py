"""A fast event's baseline (docs/model.md, "Baselines", "Meter before"): the site's level in
the seconds before a trigger, from the raw samples (times in seconds, loads in kW passed in).

Bad parameters raise `InvalidBaselineError` naming the parameter; samples that give no level
(a gap, none in the window, a missing reading) raise `NoBaselineError` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flexmodel.errors import InvalidBaselineError, NoBaselineError
from flexmodel.localdays import FloatArray


@dataclass(frozen=True)
class MeterBeforeRule:
    """A fast event's baseline, from the raw samples: the mean of the readings in the
    `window_s` before the trigger (`meter_before`), none missing and no stretch longer than
    `max_gap_s` without one. Its meter-after level is the same mean over the `window_s` that
    end at the event's end."""

    window_s: float
    max_gap_s: float

    def __post_init__(self) -> None:
        for name in ("window_s", "max_gap_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise InvalidBaselineError(f"{name} {value!r} must be a number of seconds above 0")
        if self.max_gap_s > self.window_s:
            raise InvalidBaselineError(
                f"max_gap_s {self.max_gap_s:g} exceeds window_s {self.window_s:g}"
            )


@dataclass(frozen=True)
class MeterBefore:
    """A fast event's baseline: the mean of the `samples` readings in the `window_s` before
    `trigger_s` [kW]."""

    baseline_kw: float
    trigger_s: float
    window_s: float
    samples: int


def meter_before(
    times_s: Sequence[float] | FloatArray,
    load_kw: Sequence[float] | FloatArray,
    *,
    trigger_s: float,
    window_s: float,
    max_gap_s: float,
) -> MeterBefore:
    """The mean of the readings taken in [trigger_s - window_s, trigger_s) [kW].

    The readings are taken as evenly spaced (a plain mean); none may be missing, and no
    stretch of the window longer than `max_gap_s` may go without one (its edges included).
    """
    for name, value in (("window_s", window_s), ("max_gap_s", max_gap_s)):
        if not (math.isfinite(value) and value > 0.0):
            raise InvalidBaselineError(f"{name} {value!r} must be a number of seconds above 0")
    if not math.isfinite(trigger_s):
        raise InvalidBaselineError(f"trigger_s {trigger_s!r} must be a time [s]")
    times = np.asarray(times_s, dtype=np.float64)
    loads = np.asarray(load_kw, dtype=np.float64)
    if times.shape != loads.shape or times.ndim != 1:
        raise InvalidBaselineError("times_s and load_kw must be equally long")
    if (np.diff(times) <= 0.0).any():
        raise InvalidBaselineError("times_s must increase")
    inside = (times >= trigger_s - window_s) & (times < trigger_s)
    edges = np.concatenate(([trigger_s - window_s], times[inside], [trigger_s]))
    longest_s = float(np.diff(edges).max())
    if longest_s > max_gap_s:
        raise NoBaselineError(
            f"{longest_s:g} s without a reading in the {window_s:g} s before the trigger "
            f"(max_gap_s {max_gap_s:g})"
        )
    values = loads[inside]
    if not values.size:
        raise NoBaselineError(f"no reading in the {window_s:g} s before the trigger")
    if np.isnan(values).any():
        raise NoBaselineError(f"a reading in the {window_s:g} s before the trigger is missing")
    return MeterBefore(float(values.mean()), trigger_s, window_s, int(values.size))
