"""The meter feed: samples a `Meter` on a period and believes only plausible readings.

A reading is rejected, with its reason counted and shown as the feed's fault, when the meter
raised (`error`: a timeout, a refused connection, an answer of the wrong shape), when it is not
a finite number (`not_finite`), below zero (`negative`), above the site's physical maximum
(`above_max`), or when it moved from the last good reading by more than the largest step the
site can make in one period (`jump`). A jump is believed once the next reading confirms the new
level (within the same step of it): a spike is dropped, a real step costs one period. With no
good reading for longer than `max_age_s` the feed is `stale`. Readings that are well formed
but do not answer the GPUs as the meter should (stuck, no response, implausible: the
`gateway.meter.watch`) make the feed `suspect`: they are still kept, so the watch sees the
meter answer again, but not believed until it does. While it is faulted the last good reading
is still shown, with its age, but `believed_kw` and `filtered_kw` give None: the site loop then
holds its correction and the plan falls back to the model.

The feed also knows the step its meter reads in (`step_kw`: a register in 0.5 kW, say): the
smallest of the good readings' last `STEP_MEMORY` changes, when every one is a whole number
of it (none below `MIN_STEP_KW`, a watt). A reading's change of one step is a true change
anywhere from none to two steps: the meter watch and the site loop's static-step test read
such a meter by its steps.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

import numpy as np

from gateway.clock import Clock
from gateway.errors import MeterError
from gateway.meter.sources import Meter

REJECT_REASONS = ("error", "not_finite", "negative", "above_max", "jump")
SUSPECT_REASONS = ("stuck", "no_response", "wrong_sign", "implausible")
#: The readings' last this many changes show the step the meter reads in, once there are
#: `STEP_CHANGES` of them; changes below `MIN_STEP_KW` are no step (a meter in watts or
#: finer, or a float's last bits).
STEP_MEMORY = 24
STEP_CHANGES = 4
MIN_STEP_KW = 1e-3


class MeterState(TypedDict):
    """The `meter` object of `GET /v1/site`."""

    source: str
    facility_power_kw: float | None  #: the last good reading [kW]
    measured_at: datetime | None
    age_s: float | None  #: how old that reading is [s]
    estimated: bool  #: False: a real meter (the site's estimate says True)
    fault: str | None  #: None while the feed is believed, else why not


@dataclass(frozen=True)
class Reading:
    power_kw: float
    measured_at: datetime
    monotonic_s: float


class MeterFeed:
    def __init__(
        self,
        meter: Meter,
        *,
        clock: Clock,
        period_s: float,
        max_age_s: float | None = None,
        max_step_kw: float | None = None,
        max_kw: float | None = None,
        history_s: float = 600.0,
    ) -> None:
        """`max_age_s` defaults to three periods; `max_step_kw` (the largest believable change
        between two readings) and `max_kw` (the site's physical maximum) are off when None;
        `history_s` is how far back `recent` and `filtered_kw` can look."""
        max_age_s = 3 * period_s if max_age_s is None else max_age_s
        for name, value in (("period_s", period_s), ("max_age_s", max_age_s)):
            if not value > 0:
                raise ValueError(f"the meter feed's {name} must be positive, not {value}")
        for name, bound in (("max_step_kw", max_step_kw), ("max_kw", max_kw)):
            if bound is not None and not bound > 0:
                raise ValueError(f"the meter feed's {name} must be positive or None, not {bound}")
        if history_s < period_s:
            raise ValueError(f"history_s {history_s} is shorter than one period ({period_s} s)")
        self.meter, self.clock, self.period_s = meter, clock, period_s
        self.max_age_s, self.max_step_kw, self.max_kw = max_age_s, max_step_kw, max_kw
        self.history_s = history_s
        #: /metrics counters: readings believed, and readings rejected by reason
        self.readings = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.suspected = dict.fromkeys(SUSPECT_REASONS, 0)  #: suspicions raised, by reason
        self._history: deque[Reading] = deque()
        self._fault: str | None = "no reading yet"
        self._suspicion: str | None = None
        #: from when the readings are not believed (the start of the interval judged wrong)
        self.suspect_since_s: float | None = None
        self._unconfirmed_kw: float | None = None  #: a jump waiting for the next reading
        #: the sizes of the good readings' last changes [kW]
        self._changes: deque[float] = deque(maxlen=STEP_MEMORY)

    async def run(self) -> None:
        """Sample every period until cancelled, then close the meter's connections."""
        try:
            while True:
                started_s = self.clock.monotonic()
                await self.sample()
                await self.clock.sleep(self.period_s - (self.clock.monotonic() - started_s))
        finally:
            await self.meter.aclose()

    async def sample(self) -> None:
        """Read the meter once and keep the reading if it is believable."""
        try:
            power_kw = await self.meter.read_kw()
        except MeterError as exc:
            self._reject("error", str(exc))
            return
        problem = self._implausible(power_kw)
        if problem is not None:
            self._reject(*problem)
            return
        self._unconfirmed_kw, self._fault = None, None
        self.readings += 1
        now_s = self.clock.monotonic()
        if self._history and power_kw != self._history[-1].power_kw:
            self._changes.append(abs(power_kw - self._history[-1].power_kw))
        self._history.append(Reading(power_kw, self.clock.now(), now_s))
        while self._history[0].monotonic_s < now_s - self.history_s:
            self._history.popleft()

    def _implausible(self, power_kw: float) -> tuple[str, str] | None:
        if not math.isfinite(power_kw):
            return "not_finite", f"the meter read {power_kw} kW"
        if power_kw < 0:
            return "negative", f"the meter read {power_kw:g} kW, below zero"
        if self.max_kw is not None and power_kw > self.max_kw:
            return "above_max", (
                f"the meter read {power_kw:g} kW, above the site's maximum {self.max_kw:g} kW"
            )
        last = self._history[-1] if self._history else None
        step = self.max_step_kw
        if step is not None and last is not None and abs(power_kw - last.power_kw) > step:
            confirmed = (
                self._unconfirmed_kw is not None and abs(power_kw - self._unconfirmed_kw) <= step
            )
            self._unconfirmed_kw = power_kw
            if not confirmed:
                return "jump", (
                    f"the meter jumped from {last.power_kw:g} to {power_kw:g} kW, more than "
                    f"the {step:g} kW a period allows (believed once confirmed)"
                )
        return None

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        self._fault = f"{reason}: {detail}"

    def suspect(self, reason: str, detail: str, since_s: float) -> None:
        """Stop believing well-formed readings that do not answer the GPUs as they should."""
        if self._suspicion is None:
            self.suspected[reason] += 1
            self.suspect_since_s = since_s
        self._suspicion = f"{reason}: {detail}"

    def clear_suspicion(self) -> None:
        self._suspicion, self.suspect_since_s = None, None

    @property
    def suspicion(self) -> str | None:
        return self._suspicion

    def last(self) -> Reading | None:
        """The last well-formed reading, believed or not."""
        return self._history[-1] if self._history else None

    def state(self) -> MeterState:
        last = self._history[-1] if self._history else None
        age_s = None if last is None else self.clock.monotonic() - last.monotonic_s
        fault = self._fault or self._suspicion
        if fault is None and age_s is not None and age_s > self.max_age_s:
            fault = f"stale: no good reading for {age_s:.1f} s (max age {self.max_age_s:g} s)"
        return {
            "source": self.meter.source,
            "facility_power_kw": None if last is None else last.power_kw,
            "measured_at": None if last is None else last.measured_at,
            "age_s": age_s,
            "estimated": False,
            "fault": fault,
        }

    @property
    def step_kw(self) -> float:
        """The step the meter reads in [kW]: the smallest of the readings' last changes,
        where every change is a whole number of it (0: no steps seen)."""
        if len(self._changes) < STEP_CHANGES:
            return 0.0
        step = min(self._changes)
        if step < MIN_STEP_KW:
            return 0.0
        ratios = np.array(self._changes) / step
        return step if bool(np.all(np.abs(ratios - np.round(ratios)) < 0.05)) else 0.0

    def believed_kw(self) -> float | None:
        """The last good reading [kW], or None while the feed is faulted."""
        state = self.state()
        return state["facility_power_kw"] if state["fault"] is None else None

    def recent(self, window_s: float) -> list[Reading]:
        """The good readings of the last `window_s` seconds (at most `history_s`), oldest first."""
        since_s = self.clock.monotonic() - window_s
        return [r for r in self._history if r.monotonic_s >= since_s]

    def filtered_kw(self, window_s: float) -> float | None:
        """The moving average of the good readings over the last `window_s` [kW] (the site
        loop's measurement), or None while the feed is faulted."""
        if window_s <= 0:
            raise ValueError(f"the filter window must be positive, not {window_s} s")
        readings = self.recent(window_s)
        if self.state()["fault"] is not None or not readings:
            return None
        return sum(r.power_kw for r in readings) / len(readings)
