"""OpenADR 2.0b event signals -> facility-level reductions, interval by interval.

Works on an event as openleadr parses it (`openleadr.messaging.parse_message`): a pure function,
so the VEN and the tests share it; the result is the core's `ExternalEvent`. The signal's
**name** decides what it means:

- SIMPLE (any case), any type: level 0-3 (rounded, clipped) -> `level_shares` of the
  baseline facility power (0, 10, 25, 40%), the baseline the event began with;
- LOAD_DISPATCH `setpoint`: a facility level to hold: baseline - setpoint, at least 0,
  re-evaluated whenever the baseline changes;
- LOAD_DISPATCH `delta`: -value when negative (the change from what the site would have
  used); a positive delta asks for more load: opt out;
- LOAD_CONTROL `x-loadControlCapacity`: a level, value * max capacity (a fraction of the
  site's maximum load), and a ceiling (held below by the site loop's margin);
  `x-loadControlPercentOffset`: -value % of the baseline the event
  began with when negative, opt out when positive; `x-loadControlSetpoint`: a level, as a
  setpoint;
- anything else: not acted on, with the reason; if nothing is left, opt out.

Units come from the signal's `itemUnits` and `siScaleCode` (W, kW, MW); a signal without
them is taken in kW. Intervals start at the event's dtstart plus the durations of those before
them unless they carry their own; `startafter` shifts the whole schedule by a random offset in
`[0, startafter]`; a ramp-up adds RAMP_STEPS intervals before the first one, stepping caps
down so its target holds from its start. When several
signals overlap, the strictest reduction holds in each time slice.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gateway.services.grid import ExternalEvent, Interval

#: Share of the baseline facility power each SIMPLE level sheds (0 to 3).
LEVEL_SHARES = (0.0, 0.10, 0.25, 0.40)
#: Ramp-up: caps step down in this many equal steps before the first interval starts.
RAMP_STEPS = 3
#: An open-ended event (duration 0) is scheduled for this long, until cancelled.
OPEN_ENDED = timedelta(hours=24)
_SCALE_TO_KW = {None: 1.0, "none": 1e-3, "k": 1.0, "M": 1e3, "G": 1e6}


@dataclass(frozen=True)
class SiteLoad:
    """What a signal's levels and fractions are taken against."""

    baseline_facility_kw: float  #: what the site draws uncapped
    max_capacity_kw: float  #: the baseline with every GPU at its maximum limit
    level_shares: tuple[float, ...] = LEVEL_SHARES


@dataclass(frozen=True)
class Party:
    """Who this VEN is, for an event's targets: its venID, groups and resources."""

    ven_id: str | None
    groups: frozenset[str] = frozenset()
    resources: frozenset[str] = frozenset()

    def untargeted_reason(self, event: Mapping[str, Any]) -> str | None:
        """None when the event is for this VEN (no targets, or one of them names it)."""
        targets = [t for t in event.get("targets") or [] if isinstance(t, Mapping)]
        if not targets:
            return None
        for target in targets:
            if target.get("ven_id") is not None and target.get("ven_id") == self.ven_id:
                return None
            if target.get("group_id") in self.groups or target.get("resource_id") in self.resources:
                return None
        named = ", ".join(f"{k}={v}" for t in targets for k, v in t.items())
        return f"not targeted at this VEN (targets: {named})"


def read_event(
    event: Mapping[str, Any],
    site: SiteLoad,
    rng: random.Random | None = None,
    party: Party | None = None,
) -> ExternalEvent:
    """The facility reductions an OpenADR event asks for, interval by interval.

    With `party`, an event whose targets name neither this VEN nor one of its groups or
    resources is opted out of, with the reason.
    """
    descriptor = event.get("event_descriptor", {})
    period = event.get("active_period", {})
    startafter = _seconds(period.get("tolerance", {}).get("tolerate", {}).get("startafter"))
    offset = (rng or random.Random()).uniform(0.0, startafter) if startafter > 0 else 0.0
    out = ExternalEvent(
        event_id=str(descriptor.get("event_id")),
        modification=int(descriptor.get("modification_number") or 0),
        status=str(descriptor.get("event_status", "far")),
        test=_is_true(descriptor.get("test_event")),
        ramp_up_s=_seconds(period.get("ramp_up")),
        start_offset_s=offset,
    )
    start = period["dtstart"] + timedelta(seconds=offset)
    total = period.get("duration") or timedelta(0)
    pieces: list[Interval] = []
    for signal in event.get("event_signals", []):
        reductions, reason = _signal(signal, site)
        if reason is not None:
            out.ignored.append(reason)
            if reason.startswith("opt out: "):
                out.opt_out_reason = reason.removeprefix("opt out: ")
            continue
        pieces += _timed(signal, reductions, start, total)
    if party is not None and (elsewhere := party.untargeted_reason(event)):
        out.opt_out_reason = elsewhere
    if out.opt_out_reason is None and not pieces:
        out.opt_out_reason = "no signal flexgate can act on: " + "; ".join(out.ignored or ["none"])
    out.intervals = [] if out.opt_out_reason else _strictest(pieces)
    if out.intervals and out.ramp_up_s > 0:
        out.intervals = _ramp(out.intervals[0], out.ramp_up_s) + out.intervals
    return out


def _ramp(first: Interval, ramp_up_s: float) -> list[Interval]:
    """Steps of 1/n, 2/n ... n/n of the first interval's target over the ramp-up before it,
    so the target already holds when the interval starts."""
    step = timedelta(seconds=ramp_up_s / RAMP_STEPS)
    begin = first.start - RAMP_STEPS * step
    return [
        dataclasses.replace(
            first,
            start=begin + i * step,
            end=begin + (i + 1) * step,
            reduction_kw=first.reduction_kw * (i + 1) / RAMP_STEPS,
            fraction=(i + 1) / RAMP_STEPS,
        )
        for i in range(RAMP_STEPS)
    ]


@dataclass(frozen=True)
class _Target:
    reduction_kw: float  #: at receipt
    level_kw: float | None = None
    baseline_share: float | None = None
    ceiling: bool = False


def _level(level_kw: float, base: float, ceiling: bool = False) -> _Target:
    return _Target(max(base - level_kw, 0.0), level_kw=level_kw, ceiling=ceiling)


def _share(share: float, base: float) -> _Target:
    return _Target(share * base, baseline_share=share)


def _signal(signal: Mapping[str, Any], site: SiteLoad) -> tuple[list[_Target], str | None]:
    """Each interval's target, or why the signal is not acted on."""
    name = str(signal.get("signal_name", "")).upper()
    kind = str(signal.get("signal_type", ""))
    label = f"{signal.get('signal_name')}/{kind}"
    values = [iv.get("signal_payload") for iv in signal.get("intervals", [])]
    if not values or any(v is None or not math.isfinite(float(v)) for v in values):
        return [], f"{label}: an interval has no payload"
    raw = [float(v) for v in values]
    scale = _kw_per_unit(signal)
    base, cap = site.baseline_facility_kw, site.max_capacity_kw
    if name == "SIMPLE":
        shares = site.level_shares
        return [_share(shares[min(max(round(v), 0), len(shares) - 1)], base) for v in raw], None
    if (name, kind) in (("LOAD_DISPATCH", "setpoint"), ("LOAD_CONTROL", "x-loadControlSetpoint")):
        return [_level(v * scale, base) for v in raw], None
    if name == "LOAD_DISPATCH" and kind == "delta":
        if any(v > 0 for v in raw):
            return [], f"opt out: {label} asks for more load (a positive delta)"
        return [_Target(-v * scale) for v in raw], None
    if name == "LOAD_CONTROL" and kind == "x-loadControlCapacity":
        return [_level(v * cap, base, ceiling=True) for v in raw], None
    if name == "LOAD_CONTROL" and kind == "x-loadControlPercentOffset":
        if any(v > 0 for v in raw):
            return [], f"opt out: {label} asks for more load (a positive offset)"
        return [_share(-v / 100.0, base) for v in raw], None
    return [], f"{label}: not a signal flexgate acts on"


def _timed(
    signal: Mapping[str, Any], targets: list[_Target], start: datetime, total: timedelta
) -> list[Interval]:
    out, cursor = [], start
    intervals = signal.get("intervals", [])
    for i, (iv, target) in enumerate(zip(intervals, targets, strict=True)):
        begin = iv.get("dtstart") or cursor
        length = iv.get("duration") or timedelta(0)
        if not length:  # an open interval runs to the event's end
            length = (
                (start + (total or OPEN_ENDED)) - begin if i == len(intervals) - 1 else timedelta(0)
            )
        out.append(
            Interval(
                begin,
                begin + length,
                target.reduction_kw,
                level_kw=target.level_kw,
                baseline_share=target.baseline_share,
                ceiling=target.ceiling,
            )
        )
        cursor = begin + length
    return [iv for iv in out if iv.end > iv.start]


def _strictest(pieces: list[Interval]) -> list[Interval]:
    """One target per time slice: the signal asking for the largest reduction (at receipt)
    among those active in it; equal neighbours merged."""
    edges = sorted({p.start for p in pieces} | {p.end for p in pieces})
    out: list[Interval] = []
    for begin, end in itertools.pairwise(edges):
        active = [p for p in pieces if p.start < end and p.end > begin]
        if not active:
            continue
        strictest = dataclasses.replace(
            max(active, key=lambda p: p.reduction_kw), start=begin, end=end
        )
        if out and out[-1].end == begin and _same_target(out[-1], strictest):
            out[-1] = dataclasses.replace(out[-1], end=end)
        else:
            out.append(strictest)
    return out


def _same_target(a: Interval, b: Interval) -> bool:
    return (a.reduction_kw, a.level_kw, a.baseline_share, a.ceiling) == (
        b.reduction_kw,
        b.level_kw,
        b.baseline_share,
        b.ceiling,
    )


def _kw_per_unit(signal: Mapping[str, Any]) -> float:
    """kW per unit of the signal's payload (case matters: mW is not MW)."""
    measurement = signal.get("measurement") or {}
    units = str(measurement.get("item_units") or "kW")
    scale = measurement.get("si_scale_code")
    per_unit = {"W": 1e-3, "kW": 1.0, "MW": 1e3, "mW": 1e-6}.get(units, 1.0)
    if units == "W" and scale not in (None, "none"):
        per_unit = _SCALE_TO_KW.get(scale, per_unit)
    return per_unit


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _is_true(value: Any) -> bool:
    return value is True or str(value).lower() == "true"
