"""The program's baseline rule in the VENs' reports (docs/openadr.md, "Reports under the
program's baseline"): an event's figures as its settlement gives them.

`FLEXGATE_REPORT_BASELINE` names the rule (a preset of `flexmodel.baselines`). For an event and
a span of its time, `over` writes what the meter history holds (`MeterHistory.flush`), settles
the event under that rule alone (`Settlement.doc`, the figures `GET /v1/events/{id}/settlement`
shows) and folds the settlement intervals inside the span into one `Figures`: the baseline and
the metered load (hours-weighted means), and whether any of it was estimated (no meter, or
the meter faulted). `intervals` gives each settlement interval of the event as it stands.

The span is read on the longest grid of whole minutes it falls on, the settlement interval
first (1, 5, 15 or 30 minutes after it); a span of part minutes, or one the event's settlement
intervals do not cover whole, has no figures. A figure the rule or the history cannot give
(too few eligible days, the hours after a same-day event not yet come, no reading) is None,
with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.errors import GatewayError
from gateway.services.meterhistory import MeterHistory
from gateway.services.settlement import Settlement

#: The grids a span may be read on, after the settlement interval's own [min].
GRIDS_MIN = (30, 15, 5, 1)


@dataclass(frozen=True)
class Figures:
    """One span of an event under the program's rule: the baseline and the metered load over
    it [kW] (None: not known, `reason` says why) and whether the metered load was estimated."""

    start: datetime
    end: datetime
    baseline_kw: float | None
    metered_kw: float | None
    estimated: bool = False
    reason: str | None = None

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600.0

    @property
    def delta_kw(self) -> float | None:
        """The metered load less the baseline [kW]: negative when the site sheds."""
        if self.baseline_kw is None or self.metered_kw is None:
            return None
        return self.metered_kw - self.baseline_kw


class ProgramBaseline:
    def __init__(self, rule: str, settlement: Settlement, history: MeterHistory) -> None:
        self.rule, self.settlement, self.history = rule, settlement, history

    @property
    def interval_min(self) -> int:
        """The settlement interval [min]."""
        return self.settlement.settings.settlement_interval_min

    async def over(self, event_id: str, begin: datetime, end: datetime) -> Figures:
        """The stored event's figures over [begin, end)."""
        minutes = grid_min(begin, end, self.interval_min)
        if minutes is None:
            return Figures(
                begin, end, None, None, reason=f"{_span(begin, end)} is not whole minutes"
            )
        rows, reason = await self._rows(event_id, minutes)
        inside = [r for r in rows if begin <= r.start and r.end <= end]
        if sum(r.hours for r in inside) * 3600 < (end - begin).total_seconds() - 1e-6:
            reason = reason or f"the settlement does not cover {_span(begin, end)}"
            return Figures(begin, end, None, None, reason=reason)
        return combined(inside, begin, end, reason)

    async def intervals(self, event_id: str) -> list[Figures]:
        """Each settlement interval of the stored event, as its settlement now gives it."""
        rows, _ = await self._rows(event_id, self.interval_min)
        return rows

    async def _rows(self, event_id: str, minutes: int) -> tuple[list[Figures], str | None]:
        await self.history.flush()
        try:
            doc = await self.settlement.doc(event_id, rules=self.rule, interval_min=minutes)
        except GatewayError as exc:  # the event gone, an interval the site's zone refuses
            return [], f"no settlement of {event_id}: {exc}"
        [rule] = doc["rules"]
        return [_figures(row, rule["reason"]) for row in rule["intervals"]], rule["reason"]


def grid_min(begin: datetime, end: datetime, settlement_min: int) -> int | None:
    """The longest grid [min] both ends of the span fall on, or None."""
    for minutes in (settlement_min, *(m for m in GRIDS_MIN if m < settlement_min)):
        step_s = minutes * 60
        if all(t.timestamp() % step_s == 0 for t in (begin, end)) and end > begin:
            return minutes
    return None


def combined(
    rows: Sequence[Figures], begin: datetime, end: datetime, reason: str | None
) -> Figures:
    """The rows' figures over [begin, end): hours-weighted means, None if any is None."""
    if len(rows) == 1:
        return rows[0]

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            return None
        total_h = math.fsum(r.hours for r in rows)
        return math.fsum(v * r.hours for v, r in zip(known, rows, strict=True)) / total_h

    baseline_kw = mean([r.baseline_kw for r in rows])
    metered_kw = mean([r.metered_kw for r in rows])
    estimated = any(r.estimated for r in rows)
    why = next((r.reason for r in rows if r.reason), reason)
    return Figures(begin, end, baseline_kw, metered_kw, estimated, why)


def _figures(row: dict[str, Any], reason: str | None) -> Figures:
    start, end = datetime.fromisoformat(row["start"]), datetime.fromisoformat(row["end"])
    if row["baseline_kw"] is not None and row["metered_kw"] is None:
        reason = f"no meter reading in {_span(start, end)}"
    return Figures(
        start,
        end,
        row["baseline_kw"],
        row["metered_kw"],
        estimated=bool(row["estimated"] or row["fault"]),
        reason=reason,
    )


def _span(begin: datetime, end: datetime) -> str:
    return f"[{begin.isoformat()}, {end.isoformat()})"
