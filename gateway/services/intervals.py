"""An event's intervals as the store keeps them, and the target they set at a moment.

A stored interval is `{"start", "end", "reduction_kw", "level_kw"?, "baseline_share"?,
"fraction"?}` with times in ISO UTC (`gateway.services.grid.Interval`). A level follows the
site's baseline now; a share is of the baseline the event began with (`EventRow.baseline_kw`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.services.grid import Interval
from gateway.store.models import EventRow, as_utc


def stored_doc(interval: Interval) -> dict[str, Any]:
    """An interval as stored; a level or a share only where it has one."""
    doc: dict[str, Any] = {
        "start": as_utc(interval.start).isoformat(),
        "end": as_utc(interval.end).isoformat(),
        "reduction_kw": interval.reduction_kw,
    }
    if interval.level_kw is not None:
        doc["level_kw"] = interval.level_kw
    if interval.baseline_share is not None:
        doc["baseline_share"] = interval.baseline_share
    if interval.fraction != 1.0:
        doc["fraction"] = interval.fraction
    if interval.ceiling:
        doc["ceiling"] = True
    return doc


def from_doc(doc: dict[str, Any]) -> Interval:
    return Interval(
        start=datetime.fromisoformat(doc["start"]),
        end=datetime.fromisoformat(doc["end"]),
        reduction_kw=float(doc["reduction_kw"]),
        level_kw=doc.get("level_kw"),
        baseline_share=doc.get("baseline_share"),
        fraction=float(doc.get("fraction", 1.0)),
        ceiling=bool(doc.get("ceiling", False)),
    )


def level_now(event: EventRow, now: datetime) -> tuple[float | None, bool]:
    """The facility level the event's interval now asks the meter to hold, if it is a level,
    and whether it is a ceiling (a maximum) rather than a setpoint."""
    for doc in event.intervals:
        interval = from_doc(doc)
        if interval.start <= now < interval.end and interval.level_kw is not None:
            level_kw = interval.fraction * interval.level_kw + (1 - interval.fraction) * float(
                event.baseline_kw or 0.0
            )
            return level_kw, interval.ceiling
    return None, False


def reduction_now(event: EventRow, now: datetime, baseline_kw: float) -> float:
    """The event's target now [kW]: its interval that holds `now` (0 between or outside
    them), with a level taken against the baseline now and a share against the baseline the
    event began with (`baseline_kw` until it has begun)."""
    for doc in event.intervals:
        interval = from_doc(doc)
        if interval.start <= now < interval.end:
            began_kw = event.baseline_kw if event.baseline_kw is not None else baseline_kw
            return interval.reduction_now_kw(baseline_kw, began_kw)
    return 0.0
