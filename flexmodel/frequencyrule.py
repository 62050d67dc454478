"""When a frequency feed fires the fast path (docs/fast.md, "The frequency trigger").

Pure: readings in (a time [s] and a frequency [Hz], or None for a feed that did not answer),
a decision out. Two modes:

- **threshold**: `depth_pct` while the frequency is below `threshold_hz`;
- **droop**: nothing within `dead_band_hz` below `nominal_hz`, then a depth rising linearly to
  the deepest armed one at `full_hz` (and below), snapped down to the nearest armed depth at
  or below it (a depth that is not armed cannot be fired; rounding down never sheds more than
  the droop asks).

The **crossing** is the first reading that asks for a depth; it fires at once unless the
**re-trigger limit** forbids (at most one trigger per `retrigger_s`), then as soon as it
allows. Each trigger holds its caps `hold_s`; while the frequency stays low the rule renews
it before it runs out (and fires a new depth when the droop asks for another one, within the
limit). It is **released** when the frequency, lowered by `hysteresis_hz`, would ask for
nothing: no renewal follows, and the caps in force end with their hold. A reading that is
missing or outside `min_hz`-`max_hz` is a **fault**: it never fires nor renews, and changes
nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from flexmodel.errors import FlexModelError

Mode = Literal["threshold", "droop"]


@dataclass(frozen=True)
class FrequencyRule:
    mode: Mode
    depths_pct: tuple[float, ...]  #: the armed depths, rising
    nominal_hz: float = 50.0
    threshold_hz: float = 49.7  #: threshold mode: fires below this
    depth_pct: float = 0.0  #: threshold mode: the depth fired (an armed one)
    dead_band_hz: float = 0.015  #: droop mode: nothing within this below nominal
    full_hz: float = 49.5  #: droop mode: the deepest armed depth at and below this
    hysteresis_hz: float = 0.05
    retrigger_s: float = 2.0
    hold_s: float = 30.0
    min_hz: float = 45.0  #: a reading outside min-max is a fault
    max_hz: float = 65.0

    def __post_init__(self) -> None:
        numbers = (self.nominal_hz, self.threshold_hz, self.full_hz, self.dead_band_hz)
        if not all(math.isfinite(v) for v in numbers) or not self.depths_pct:
            raise FlexModelError("a frequency rule needs finite frequencies and armed depths")
        if not self.min_hz < self.full_hz < self.nominal_hz - self.dead_band_hz <= self.max_hz:
            raise FlexModelError(
                f"the droop's full depth at {self.full_hz:g} Hz must lie above the plausible "
                f"minimum {self.min_hz:g} Hz and below nominal {self.nominal_hz:g} Hz less the "
                f"dead band {self.dead_band_hz:g} Hz"
            )
        armed = ", ".join(f"{d:g}" for d in self.depths_pct)
        if self.mode == "threshold" and not (
            self.min_hz < self.threshold_hz < self.nominal_hz and self.depth_pct in self.depths_pct
        ):
            raise FlexModelError(
                f"the threshold {self.threshold_hz:g} Hz must lie below nominal and its depth "
                f"{self.depth_pct:g}% be an armed one ({armed})"
            )
        if self.dead_band_hz < 0 or self.hysteresis_hz < 0 or self.retrigger_s < 0:
            raise FlexModelError("the dead band, hysteresis and re-trigger limit are >= 0")
        if not self.hold_s > self.retrigger_s:
            raise FlexModelError(
                f"the hold {self.hold_s:g} s must exceed the re-trigger limit "
                f"{self.retrigger_s:g} s (else the caps lapse between renewals)"
            )


@dataclass(frozen=True)
class RuleState:
    depth_pct: float = 0.0  #: the depth fired and held now (0: none)
    crossing_s: float | None = None  #: when this excursion crossed (None: released)
    last_trigger_s: float | None = None


@dataclass(frozen=True)
class Fire:
    depth_pct: float
    duration_s: float
    crossing_s: float  #: when the excursion it answers crossed
    hz: float  #: the reading that fired it


def fault(rule: FrequencyRule, hz: float | None) -> str | None:
    """Why a reading cannot be acted on, or None."""
    if hz is None:
        return "no reading"
    if not math.isfinite(hz) or not rule.min_hz <= hz <= rule.max_hz:
        return f"{hz:g} Hz is implausible (outside {rule.min_hz:g}-{rule.max_hz:g} Hz)"
    return None


def requested_depth(rule: FrequencyRule, hz: float) -> float:
    """The armed depth a frequency asks for [%] (0: none)."""
    if rule.mode == "threshold":
        return rule.depth_pct if hz < rule.threshold_hz else 0.0
    start = rule.nominal_hz - rule.dead_band_hz
    if hz >= start:
        return 0.0
    share = min(1.0, (start - hz) / (start - rule.full_hz))
    wanted = share * max(rule.depths_pct) + 1e-9  # a depth reached exactly counts
    return max((d for d in rule.depths_pct if d <= wanted), default=0.0)


def step(
    rule: FrequencyRule, state: RuleState, t_s: float, hz: float | None
) -> tuple[RuleState, Fire | None]:
    """The state after a reading at `t_s`, and the trigger it fires (None: none)."""
    if hz is None or fault(rule, hz) is not None:
        return state, None
    wanted = requested_depth(rule, hz)
    if state.crossing_s is None:
        if wanted == 0.0:
            return state, None
        state = replace(state, crossing_s=t_s)
    elif requested_depth(rule, hz - rule.hysteresis_hz) == 0.0:
        return RuleState(last_trigger_s=state.last_trigger_s), None
    depth = wanted or state.depth_pct
    since = math.inf if state.last_trigger_s is None else t_s - state.last_trigger_s
    renew_after = max(rule.retrigger_s, rule.hold_s - rule.retrigger_s)
    if depth == 0.0 or since < (rule.retrigger_s if depth != state.depth_pct else renew_after):
        return state, None
    assert state.crossing_s is not None
    fire = Fire(depth_pct=depth, duration_s=rule.hold_s, crossing_s=state.crossing_s, hz=hz)
    return replace(state, depth_pct=depth, last_trigger_s=t_s), fire
