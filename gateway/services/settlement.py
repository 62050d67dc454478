"""Per-event settlement (docs/operations.md, "Settlement"): what the utility would count.

For an event and each baseline rule of the program (`FLEXGATE_SETTLEMENT_RULES`, presets of
`flexmodel.baselines`), the meter history is read on the site's clock
(`gateway.services.meterdays`), the rule's baseline computed for the event's intervals, and
each interval settled: the baseline, the metered load, the delivered kW (baseline less
metered) and kWh, the target the event record states for it, and whether it was met. A rule
that gives no baseline (too few eligible days, a window without readings) says why instead.

Settlement intervals are the clock intervals of `FLEXGATE_SETTLEMENT_INTERVAL_MIN` that
overlap the event. An interval's target is the time-weighted mean of the event's intervals'
reductions over it (0 outside them): a fixed reduction as stored, a level as the baseline
less the level, a share of the baseline the event began with. Compliance is the share of the
settlement intervals whose delivered kW is at least their target; an interval with no
baseline or no reading is not met. A meter-before rule (`meterbefore-<S>s`) settles every
interval against the level in the S seconds before the start, from the raw samples
(`baselineread.meter_level`), and adds the meter-after level at the end. An event across the
site's midnight is settled day by day, each part on its day's baseline (`rule_baseline`). The
event days the
X-of-Y and match-day rules leave out are the local days of the other stored events (test
events excepted), whatever became of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlmodel import Session

from flexmodel.baselinedays import Baseline
from flexmodel.baselinerules import XOfYRule
from flexmodel.baselines import preset
from flexmodel.errors import FlexModelError
from flexmodel.localdays import Calendar
from flexmodel.meterbefore import MeterBeforeRule
from gateway.clock import Clock
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.services.baselineread import (
    EventSpan,
    History,
    SpanBaseline,
    day_dates,
    meter_level,
    read_history,
    rule_baseline,
)
from gateway.services.intervals import from_doc
from gateway.services.meterdays import LocalClock, calendar, day_of
from gateway.settings import GatewaySettings, interval_problem, zone_problem
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow, MeterInterval, as_utc, iso
from gateway.units import rounded

#: A delivered kW this close under the target still meets it (rounding of the means) [kW].
MET_TOLERANCE_KW = 1e-6


def settlement_link(settings: GatewaySettings, event_id: str, source: str) -> dict[str, Any]:
    """What `GET /v1/events/{id}` shows (computing it on every read would cost each listing a
    read of weeks of meter history per event): where the settlement is, under which rules."""
    rules, minutes = settings.settles_with(source)
    return {
        "href": f"/v1/events/{event_id}/settlement",
        "rules": list(rules),
        "interval_min": minutes,
        "timezone": settings.site_timezone,
    }


class Settlement:
    def __init__(self, settings: GatewaySettings, store: Store, clock: Clock) -> None:
        self.settings, self.store, self.clock = settings, store, clock

    async def doc(
        self, event_id: str, *, rules: str | None = None, interval_min: int | None = None
    ) -> dict[str, Any]:
        """`GET /v1/events/{id}/settlement`: the event settled under each rule (`rules`, a
        comma list of presets, and `interval_min` override the settings for the event's
        source: `GatewaySettings.settles_with`)."""
        names = self._rules(rules)
        minutes = self._interval(interval_min)
        return await asyncio.to_thread(self._settle, event_id, names, minutes)

    def _rules(self, rules: str | None) -> tuple[str, ...] | None:
        if rules is None:
            return None
        names = tuple(n.strip() for n in rules.split(",") if n.strip())
        if not names:
            raise InvalidRequestError("rules: name at least one baseline preset")
        for name in names:
            try:
                preset(name)
            except FlexModelError as exc:
                raise InvalidRequestError(f"rules: {exc}") from None
        return names

    def _interval(self, interval_min: int | None) -> int | None:
        if interval_min is None:
            return None
        problem = interval_problem(interval_min) or zone_problem(
            self.settings.site_timezone, interval_min
        )
        if problem:
            raise InvalidRequestError(f"interval_min: {problem}")
        return interval_min

    def _settle(
        self, event_id: str, asked: tuple[str, ...] | None, asked_min: int | None
    ) -> dict[str, Any]:
        clock = LocalClock(self.settings.site_zone)
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            if event is None:
                raise NotFoundError(f"no event '{event_id}'")
            rules, minutes = self.settings.settles_with(event.source)
            names, interval_min = asked or rules, asked_min or minutes
            plan = repo.get_plan(s, plan_id=event.plan_id) if event.plan_id else None
            span = EventSpan(event.start, event.end, clock, interval_min)
            history = read_history(
                s, span, names=names, interval_min=interval_min, exclude_event=event_id
            )
            levels = self._meter_levels(s, names, event)
        mine = [i for i in history.intervals if span.start <= i.start < span.end]
        holidays = calendar(self.settings.holiday_dates)
        return rounded(
            {
                "event_id": event.id,
                "status": event.status,
                "start": iso(event.start),
                "end": iso(event.end),
                "timezone": self.settings.site_timezone,
                "interval_min": interval_min,
                "event_day": span.day.isoformat(),
                "holidays": sorted(d.isoformat() for d in self.settings.holiday_dates),
                "event_days_excluded": [d.isoformat() for d in day_dates(history.event_days)],
                "throughput_kept": _throughput_kept(plan.doc if plan else None),
                "computed_at": iso(self.clock.now()),
                "rules": [
                    _meter_rule(n, event, mine, levels[n])
                    if n in levels
                    else _settle_rule(n, event, span, mine, history, holidays)
                    for n in names
                ],
            }
        )

    def _meter_levels(
        self, session: Session, names: Sequence[str], event: EventRow
    ) -> dict[str, MeterLevels]:
        """Each meter-before rule's levels before the event's start and its end."""
        out = {}
        keep_s, now = self.settings.meter_history_raw_keep_s, self.clock.now()
        for name in names:
            rule = preset(name)
            if isinstance(rule, MeterBeforeRule):
                before = meter_level(session, rule, event.start, now=now, raw_keep_s=keep_s)
                after = meter_level(session, rule, event.end, now=now, raw_keep_s=keep_s)
                out[name] = MeterLevels(*before, *after)
        return out


@dataclass(frozen=True)
class MeterLevels:
    """A meter-before rule's level before the event and its meter-after level at its end, each
    with why there is none."""

    before: dict[str, Any] | None
    before_reason: str | None
    after: dict[str, Any] | None
    after_reason: str | None


def _throughput_kept(plan: dict[str, Any] | None) -> float | None:
    """The share of the mix's throughput the event's current plan kept, if it says."""
    if not plan or not plan.get("throughput_before"):
        return None
    return float(plan["throughput_after"]) / float(plan["throughput_before"])


def _settle_rule(
    name: str,
    event: EventRow,
    span: EventSpan,
    intervals: Sequence[MeterInterval],
    history: History,
    holidays: Calendar,
) -> dict[str, Any]:
    found = rule_baseline(name, span, history, holidays)
    rows = [_row(i, event, found.kw(i.start)) for i in intervals]
    return _rule_doc(name, found.reason, baseline_doc(found), rows)


def _rule_doc(
    name: str, reason: str | None, baseline: dict[str, Any] | None, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    rule = preset(name)
    return {
        "rule": name,
        "kind": type(rule).__name__,
        "parameters": asdict(rule),
        "reason": reason,
        "baseline": baseline,
        "intervals": rows,
        "totals": _totals(rows),
    }


def _meter_rule(
    name: str, event: EventRow, intervals: Sequence[MeterInterval], levels: MeterLevels
) -> dict[str, Any]:
    """A meter-before rule's settlement: every interval against the level before the start;
    `meter_after`, the level over the rule's window ending at the event's end, and the kW it
    delivered against the level before."""
    before_kw = None if levels.before is None else float(levels.before["level_kw"])
    rows = [_row(i, event, (before_kw, before_kw)) for i in intervals]
    flat = {"days_used": [], "adjustment_factor": 1.0, "adjustment_kw": 0.0}
    baseline = None if before_kw is None else {**flat, "capped": False, "adjusted": False}
    out = _rule_doc(name, levels.before_reason, baseline, rows)
    after = levels.after
    if after is not None and before_kw is not None:
        after = {**after, "delivered_kw": before_kw - float(after["level_kw"])}
    out |= {
        "meter_before": levels.before,
        "meter_after": after,
        "meter_after_reason": levels.after_reason,
    }
    return out


def baseline_doc(found: SpanBaseline) -> dict[str, Any] | None:
    """The rule's baseline: its first day's figures, and for an event across the site's
    midnight `parts`, each day's (or why it has none); None when no day has one."""
    first = found.first
    if first is None:
        return None
    doc = _part_doc(first)
    if len(found.parts) > 1:
        doc["parts"] = [
            {
                "day": part.day.isoformat(),
                "start_min": part.start_min,
                "end_min": part.end_min,
                "reason": why,
                "baseline": None if kw is None else _part_doc(kw),
            }
            for part, kw, why in found.parts
        ]
    return doc


def _part_doc(found: Baseline) -> dict[str, Any]:
    return {
        "days_used": [day_of(d).isoformat() for d in found.days_used],
        "adjustment_factor": found.adjustment_factor,
        "adjustment_kw": found.adjustment_kw,
        "capped": found.capped,
        "adjusted": isinstance(found.rule, XOfYRule) and found.rule.adjustment != "none",
    }


def _row(
    interval: MeterInterval, event: EventRow, kw: tuple[float | None, float | None]
) -> dict[str, Any]:
    """One settlement interval; `kw`: its baseline and unadjusted baseline."""
    hours = (interval.end - interval.start).total_seconds() / 3600
    baseline_kw, unadjusted_kw = kw
    metered_kw = interval.mean_kw
    delivered_kw = None if baseline_kw is None or metered_kw is None else baseline_kw - metered_kw
    target_kw = _target_kw(event, interval, baseline_kw)
    return {
        "start": iso(interval.start),
        "end": iso(interval.end),
        "baseline_kw": baseline_kw,
        "unadjusted_baseline_kw": unadjusted_kw,
        "metered_kw": metered_kw,
        "delivered_kw": delivered_kw,
        "delivered_kwh": None if delivered_kw is None else delivered_kw * hours,
        "target_kw": target_kw,
        "met": delivered_kw is not None and delivered_kw >= target_kw - MET_TOLERANCE_KW,
        "estimated": interval.estimated,
        "estimated_share": interval.estimated_share,
        "fault": interval.fault,
        "gap": interval.gap,
        "hours": hours,
    }


def _target_kw(event: EventRow, interval: MeterInterval, baseline_kw: float | None) -> float:
    """The time-weighted mean over the interval of the reduction the event's intervals ask
    for [kW]."""
    total_kws = 0.0
    for doc in event.intervals:
        part = from_doc(doc)
        lo = max(as_utc(part.start), interval.start)
        hi = min(as_utc(part.end), interval.end)
        if hi <= lo:
            continue
        reference_kw = baseline_kw if baseline_kw is not None else float(event.baseline_kw or 0.0)
        began_kw = event.baseline_kw if event.baseline_kw is not None else reference_kw
        if part.level_kw is not None and baseline_kw is None:
            kw = part.reduction_kw  # no baseline to hold a level against: as received
        else:
            kw = part.reduction_now_kw(reference_kw, began_kw)
        total_kws += kw * (hi - lo).total_seconds()
    return total_kws / (interval.end - interval.start).total_seconds()


def _totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    delivered = [r for r in rows if r["delivered_kw"] is not None]
    met = sum(1 for r in rows if r["met"])
    hours = sum(r["hours"] for r in rows)
    delivered_hours = sum(r["hours"] for r in delivered)
    return {
        "intervals": len(rows),
        "intervals_met": met,
        "compliance": met / len(rows) if rows else None,
        "delivered_kwh": sum(r["delivered_kwh"] for r in delivered) if delivered else None,
        "target_kwh": sum(r["target_kw"] * r["hours"] for r in rows),
        "mean_delivered_kw": (
            sum(r["delivered_kwh"] for r in delivered) / delivered_hours if delivered else None
        ),
        "mean_target_kw": sum(r["target_kw"] * r["hours"] for r in rows) / hours if rows else None,
        "estimated_intervals": [r["start"] for r in rows if r["estimated"]],
        "fault_intervals": [r["start"] for r in rows if r["fault"]],
        "unsettled_intervals": [r["start"] for r in rows if r["delivered_kw"] is None],
    }
