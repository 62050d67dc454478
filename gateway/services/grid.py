"""What the core knows of grid protocols: external events from a named source, and the hook
that tells the source when the site opts out of one.

A grid protocol (OpenADR 2.0b in `gateway.openadr`, 3.1 later) turns its messages into
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
    start: datetime
    end: datetime
    reduction_kw: float


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
