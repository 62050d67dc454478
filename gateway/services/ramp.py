"""The ramp-rate limit: how fast the gateway's plans may move the site's power.

Utilities' rules for large loads bound how fast a load may fall or rise (kW per minute, each
direction apart). With `FLEXGATE_RAMP_DOWN_KW_PER_MIN` or `FLEXGATE_RAMP_UP_KW_PER_MIN` set,
every plan's reduction at the meter moves from the one held by at most the limit times the
time since the last plan, and no more than one step's worth (`step_s`, the site loop's period)
at once: a target reached after a long hold ramps from then on, not from the hold's start.
After a restart the first plan ramps from the newest stored plan while its caps may still be
held (within a lease), not from nothing.
A target the bound holds back is re-planned every step until it is reached
(`gateway.services.desiredstate`). A shed (the reduction growing) is the power falling: the down
limit; a release (the reduction shrinking, the end-of-event rebound) is the up limit.

Each event's record (`RampReport`) counts the plans the bound held back, and the steepest
change its plans made over any minute, each way: what the event's `ramp` in the API shows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

#: A limit is judged over this span [s]: kW per minute.
MINUTE_S = 60.0


@dataclass
class RampReport:
    """One event's plans against the ramp limit (its shed, and its caps stepping back)."""

    down_kw_per_min: float | None
    up_kw_per_min: float | None
    plans: int = 0
    limited_plans: int = 0  #: plans the bound held back from the target
    #: the largest change of the planned reduction within any minute, each way [kW]
    steepest_down_kw_per_min: float = 0.0
    steepest_up_kw_per_min: float = 0.0
    _recent: deque[tuple[float, float]] = field(default_factory=deque, repr=False)

    def note(self, at_s: float, planned_kw: float, limited: bool) -> None:
        recent = self._recent
        while recent and recent[0][0] < at_s - MINUTE_S:
            recent.popleft()
        if recent:
            lowest = min(kw for _, kw in recent)
            highest = max(kw for _, kw in recent)
            self.steepest_down_kw_per_min = max(self.steepest_down_kw_per_min, planned_kw - lowest)
            self.steepest_up_kw_per_min = max(self.steepest_up_kw_per_min, highest - planned_kw)
        recent.append((at_s, planned_kw))
        self.plans += 1
        self.limited_plans += int(limited)

    def doc(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


class RampLimit:
    def __init__(
        self, down_kw_per_min: float | None, up_kw_per_min: float | None, step_s: float
    ) -> None:
        self.down_kw_per_min, self.up_kw_per_min = down_kw_per_min, up_kw_per_min
        self.step_s = step_s
        #: the reduction planned last [kW] (before any: what the agents may still hold,
        #: `Targets`), and when (monotonic; None: not yet) [s]
        self.held_kw = 0.0
        self.held_at_s: float | None = None
        self.limited = False  #: the last plan was held back from its target
        self.reports: dict[str, RampReport] = {}  #: per event

    @property
    def active(self) -> bool:
        return self.down_kw_per_min is not None or self.up_kw_per_min is not None

    def bound(self, requested_kw: float, now_s: float) -> float:
        """The reduction to plan now towards `requested_kw` [kW]; remembered as held."""
        # Only a step's worth at once: a long hold earns no ramp in advance.
        since_s = self.step_s if self.held_at_s is None else now_s - self.held_at_s
        since_min = min(since_s, self.step_s) / MINUTE_S
        planned_kw = requested_kw
        if self.down_kw_per_min is not None:
            planned_kw = min(planned_kw, self.held_kw + self.down_kw_per_min * since_min)
        if self.up_kw_per_min is not None:
            planned_kw = max(planned_kw, self.held_kw - self.up_kw_per_min * since_min)
        self.limited = abs(planned_kw - requested_kw) > 1e-9
        self.held_kw, self.held_at_s = planned_kw, now_s
        return planned_kw

    def minimum_release_s(self, from_kw: float) -> float:
        """The least time a release of `from_kw` takes under the up limit [s]."""
        if self.up_kw_per_min is None:
            return 0.0
        return MINUTE_S * from_kw / self.up_kw_per_min

    def note(self, event_id: str | None, at_s: float, planned_kw: float) -> None:
        """A plan of `event_id` (its shed, or its caps stepping back) in its record."""
        if event_id is None or not self.active:
            return
        report = self.reports.setdefault(
            event_id, RampReport(self.down_kw_per_min, self.up_kw_per_min)
        )
        report.note(at_s, planned_kw, self.limited)

    def doc(self, requested_kw: float) -> dict[str, Any]:
        """A plan's `ramp`: the limits, what was asked and whether the bound held it back."""
        return {
            "down_kw_per_min": self.down_kw_per_min,
            "up_kw_per_min": self.up_kw_per_min,
            "requested_facility_kw": requested_kw,
            "planned_facility_kw": self.held_kw,
            "limited": self.limited,
        }
