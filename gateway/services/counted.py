"""What the utility would count, before an event (docs/operations.md, "Settlement"): a quote's
and an opt-in's kW read against the program's baseline.

For a window yet to come and one preset (`flexmodel.baselines`), the rule's baseline over the
window's settlement intervals is read from the meter history as settlement reads it
(`gateway.services.baselineread`), with only what has happened by now: the site's level now
(the meter's last believed reading, or the estimate, marked) is what it would draw without the
event, so a shed of S kW is counted as the baseline less (the level less S). A baseline above
the level (today runs below the baseline days) adds to what is counted; one below takes away.

A rule that cannot give a baseline before the event says why instead of a number: same-day
(it needs the hours after the event's end), meter-before (the seconds before it), a day-of
adjustment or match window whose hours have not all happened yet, too few eligible days, no
history; for a window across the site's midnight, any day of it without a baseline. flexgate
refuses these rather than computing on part of the data: the utility will not count a
partial baseline.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from flexmodel.baselinerules import MatchDayRule, SameDayRule, XOfYRule
from flexmodel.baselines import Rule, preset
from flexmodel.meterbefore import MeterBeforeRule
from gateway.clock import Clock
from gateway.services.baselineread import (
    EventSpan,
    read_history,
    rule_baseline,
)
from gateway.services.meterdays import LocalClock, calendar
from gateway.services.settlement import baseline_doc
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso
from gateway.units import rounded

#: The sheds a quote is counted for, by the quote's field name.
QUOTE_SHEDS = ("reduction_kw", "achievable_kw", "firm_kw")


def not_before_event(name: str, rule: Rule, start: datetime, now: datetime) -> str | None:
    """Why `rule` gives no baseline for an event starting at `start`, seen at `now`; None when
    it may (its history may still fall short)."""
    if isinstance(rule, MeterBeforeRule):
        return (
            f"{name} is the site's level in the {rule.window_s:g} s before the trigger: it "
            "gives no baseline before the event (it counts the shed from the level then)"
        )
    if isinstance(rule, SameDayRule):
        return (
            f"{name} is the mean of hours before and the {rule.after_hours:g} h after the "
            "event: it gives no baseline before the event"
        )
    if isinstance(rule, XOfYRule) and rule.adjustment != "none":
        hours, lead = rule.adjustment_hours, rule.adjustment_lead_hours
        what = "day-of adjustment"
    elif isinstance(rule, MatchDayRule):
        hours, lead = rule.match_hours, rule.match_lead_hours
        what = "match window"
    else:
        return None
    ends = start - timedelta(hours=lead)
    if ends <= now:
        return None
    return (
        f"{name}'s {what} ({hours:g} h ending {lead:g} h before the start, until "
        f"{iso(ends)}) has not happened yet: no baseline before {iso(ends)}"
    )


class Counted:
    def __init__(
        self, settings: GatewaySettings, store: Store, clock: Clock, power: SitePower
    ) -> None:
        self.settings, self.store, self.clock, self.power = settings, store, clock, power

    def level_now(self) -> dict[str, Any]:
        """The site's facility level now [kW]: the meter's last believed reading, or the
        estimate (`estimated`), or before any sample the model's uncapped level."""
        last = self.power.history[-1] if self.power.history else None
        if last is not None and last.facility_kw is not None:
            estimated = self.power.feed is None
            return {"kw": last.facility_kw, "source": self.power.source, "estimated": estimated}
        model_kw = self.power.envelope()[0]
        return {"kw": model_kw, "source": "model (no reading of the site yet)", "estimated": True}

    def level_uncapped(self) -> dict[str, Any]:
        """The site's level without the caps that hold it down now: the model's [kW]."""
        return {
            "kw": self.power.envelope()[0],
            "source": "model (caps hold the site below its level now)",
            "estimated": True,
        }

    async def doc(
        self,
        name: str,
        start: datetime,
        end: datetime,
        sheds: dict[str, float | None],
        level: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What `name`'s rule would count for each shed [kW] over [start, end), from the
        site's `level` (default `level_now()`)."""
        level = level or self.level_now()
        return await asyncio.to_thread(self._doc, name, start, end, sheds, level)

    def _doc(
        self,
        name: str,
        start: datetime,
        end: datetime,
        sheds: dict[str, float | None],
        level: dict[str, Any],
    ) -> dict[str, Any]:
        rule, now = preset(name), self.clock.now()
        interval_min = self.settings.settlement_interval_min
        span = EventSpan(start, end, LocalClock(self.settings.site_zone), interval_min)
        out: dict[str, Any] = {
            "rule": name,
            "kind": type(rule).__name__,
            "parameters": asdict(rule),
            "start": iso(span.start),
            "end": iso(span.end),
            "interval_min": interval_min,
            "timezone": self.settings.site_timezone,
            "event_day": span.day.isoformat(),
            "level": level,
        }
        found, reason = None, not_before_event(name, rule, span.start, now)
        if reason is None:
            with self.store.session() as s:
                history = read_history(s, span, names=(name,), interval_min=interval_min, until=now)
            found = rule_baseline(name, span, history, calendar(self.settings.holiday_dates))
            reason = found.reason
        if reason is not None:  # every part, or no count: never one on part of the window
            found = None
        out["reason"] = reason
        out["baseline"] = None if found is None else baseline_doc(found)
        rows: list[dict[str, Any]] = []
        at = span.start
        while found is not None and at < span.end:
            step = at + timedelta(minutes=interval_min)
            rows.append({"start": iso(at), "end": iso(step), "baseline_kw": found.kw(at)[0]})
            at = step
        out["intervals"] = rows
        known: list[float] = [r["baseline_kw"] for r in rows if r["baseline_kw"] is not None]
        mean_kw = sum(known) / len(known) if known else None
        out["baseline_kw"] = mean_kw
        out["below_baseline_kw"] = None if mean_kw is None else mean_kw - level["kw"]
        out["counted_kw"] = {
            k: None if mean_kw is None or v is None else mean_kw - (level["kw"] - v)
            for k, v in sheds.items()
        }
        return rounded(out)

    async def opt_in(
        self,
        start: datetime,
        end: datetime,
        asked_kw: float,
        firm: dict[str, Any],
        level: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`FLEXGATE_OPT_IN_BASELINE`'s count of an event asking `asked_kw` (`firm`:
        `Quotes.firm`'s answer for it) from the site's `level` (default `level_now()`), with
        `short`, why the site opts out (the counted firm kW below what is asked), or None. A
        rule with no baseline does not opt out: the reason is kept and the site's own firm kW
        decides."""
        name = self.settings.opt_in_baseline
        assert name is not None
        sheds = {"firm_kw": firm["firm_kw"], "achievable_kw": firm["achievable_kw"]}
        doc = await self.doc(name, start, end, sheds, level)
        doc["asked_kw"] = asked_kw
        counted_kw = doc["counted_kw"]["firm_kw"]
        doc["short"] = None
        if counted_kw is not None and counted_kw < asked_kw * (1 - 1e-9):
            doc["short"] = (
                f"under {name} the utility would count {counted_kw:.1f} kW of the site's "
                f"{firm['firm_kw']:.1f} kW firm shed (baseline {doc['baseline_kw']:.1f} kW, "
                f"the site at {doc['level']['kw']:.1f} kW now); the event asks {asked_kw:.1f} kW"
            )
        return doc

    def recounted(self, event_id: str, counted: dict[str, Any]) -> None:
        """The event's stored `counted` brought up to date; a manual event's reason, where it
        was the last count's shortfall, is the new one's (or none)."""
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            if event is None:
                return
            stated = (event.counted or {}).get("short")
            if event.source == "manual" and event.reason == stated:
                event.reason = counted["short"]
            event.counted = counted
            s.add(event)
            s.commit()
