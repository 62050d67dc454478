"""What the core knows of grid protocols: external events from a named source, and the hook
that tells the source when the site opts out of one.

A grid protocol (OpenADR 2.0b and 3.1, both in `gateway.openadr`) turns its messages into
`ExternalEvent`s, hands them to the events service, and answers its VTN; the core never sees
the protocol's own terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gateway.store.models import EventRow


@dataclass(frozen=True)
class Interval:
    """One interval's target. A level (`level_kw`) is where the facility must stay: its
    reduction follows the load, re-evaluated as it changes. A share (`baseline_share`) is a
    fraction of the baseline the event began with. Otherwise the reduction is fixed. In all
    cases `reduction_kw` is the reduction at receipt (times `fraction`, during a ramp-up)."""

    start: datetime
    end: datetime
    reduction_kw: float
    level_kw: float | None = None  #: the facility level to hold [kW]
    baseline_share: float | None = None  #: the share of the baseline at the event's start
    fraction: float = 1.0  #: a ramp-up step's part of the target
    #: the level is a maximum the utility judges over averaging intervals (an import
    #: capacity limit), not a setpoint: the site loop plans below it by its margin
    ceiling: bool = False

    def reduction_now_kw(self, baseline_now_kw: float, baseline_at_start_kw: float) -> float:
        """The reduction this interval asks for with the site's baseline as it is now, and as
        it was when the event began [kW]."""
        if self.level_kw is not None:
            return self.fraction * max(baseline_now_kw - self.level_kw, 0.0)
        if self.baseline_share is not None:
            return self.fraction * self.baseline_share * baseline_at_start_kw
        return self.reduction_kw


@dataclass
class ExternalEvent:
    """An event as its source asked for it: facility reductions, interval by interval."""

    event_id: str  #: the source's own id
    modification: int
    status: str  #: the source's status; "cancelled" cancels
    test: bool  #: answered, never acted on
    ramp_up_s: float
    start_offset_s: float
    intervals: list[Interval] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  #: signals not acted on, and why
    opt_out_reason: str | None = None

    @property
    def start(self) -> datetime | None:
        return self.intervals[0].start if self.intervals else None

    @property
    def end(self) -> datetime | None:
        return self.intervals[-1].end if self.intervals else None


class GridProtocol(Protocol):
    source: str  #: stored as the events' `source`
    id_prefix: str  #: the events' ids are `<prefix>-<the source's id>`

    @property
    def state(self) -> str:
        """How the link stands, for /health (e.g. registered)."""
        ...

    async def opt_out(self, event: EventRow) -> None:
        """Tell the source the site opted out of this event (it was cancelled here)."""
        ...
