"""Safe mode for the 3.1 VEN: a per-program fallback import limit held while the VTN cannot be
reached (ElaadNL's Grid Aware Charging profile requires one: IMPORT_CAPACITY_LIMIT in KW).

Each program's limit [kW] is configured (FLEXGATE_VTN_FALLBACK_LIMITS, by programName), or
taken from an event the operator designates by name (FLEXGATE_VTN_FALLBACK_EVENT): such an
event's first IMPORT_CAPACITY_LIMIT value is that program's limit from then on, and the event is
a definition, not acted on. Once the VTN has been unreachable longer than
FLEXGATE_VTN_FALLBACK_AFTER_S, each limit is stored and held as an event of its own,
`oadr3-fallback-<program>` (the strictest of several holds), read and opted into like any VTN
event; when contact returns they are cancelled. Both are logged, and the event stays in the
store as the record. It is held in pieces of PIECE_S, renewed while the VTN stays away (as a
VTN modifies an event): the opt policy weighs a piece against the jobs that outlast it, where
an open-ended event would find every job ending before its window does.

A limit learned from an event lives in memory: a gateway restarted while the VTN is down holds
the configured limits only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime

from gateway.openadr.oadr31 import Event
from gateway.settings import parse_fallback_limits as parse_limits

__all__ = ["ID_PREFIX", "SafeMode", "event_id", "is_fallback", "parse_limits"]

log = logging.getLogger("flexgate.ven31")

KIND = "IMPORT_CAPACITY_LIMIT"
#: Fallback events' ids start so (after `oadr3-`): the poll's listing never names them.
ID_PREFIX = "fallback-"
PIECE_S = 600.0  #: a fallback event's length [s]
RENEW_BEFORE_S = 120.0  #: renewed once less than this is left (the VEN retries every <= 30 s)


def event_id(program_name: str) -> str:
    """The 3.1-shaped id of a program's fallback event (an objectID's characters)."""
    return ID_PREFIX + re.sub(r"[^a-zA-Z0-9_-]", "_", program_name)[:100]


def is_fallback(stored_id: str) -> bool:
    """Whether a stored event (`<the protocol's prefix>-<id>`) is a fallback limit."""
    return stored_id.partition("-")[2].startswith(ID_PREFIX)


@dataclass
class SafeMode:
    configured_kw: dict[str, float]  #: program name -> limit [kW], from the settings
    event_name: str  #: the name of events that set a program's limit ("" none)
    after_s: float  #: unreachable this long before the limits hold [s]
    learned_kw: dict[str, float] = field(default_factory=dict)  #: from designated events
    unreachable_since: float | None = None  #: monotonic [s]; None while the VTN answers
    holding: set[str] = field(default_factory=set)  #: program names whose limit holds

    def limits_kw(self) -> dict[str, float]:
        return {**self.configured_kw, **self.learned_kw}

    def learn(self, event: Event, program_name: str | None) -> bool:
        """True when `event` designates a fallback limit (then it is not to be acted on)."""
        if not self.event_name or event.event_name != self.event_name:
            return False
        values = [
            v
            for interval in event.intervals
            for payload in interval.payloads
            if payload.type == KIND
            for v in payload.values
            if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
        ]
        name = program_name or event.program_id
        if not values:
            log.warning("safe mode: event %s names no %s in kW: ignored", event.id, KIND)
        elif self.learned_kw.get(name) != float(values[0]):
            self.learned_kw[name] = float(values[0])
            log.info(
                "safe mode: program %s's fallback limit is %g kW (event %s)",
                name,
                values[0],
                event.id,
            )
        return True

    def lost_contact(self, now_s: float) -> bool:
        """Note the VTN unreachable now; True when the limits are due to hold."""
        if self.unreachable_since is None:
            self.unreachable_since = now_s
        return now_s - self.unreachable_since >= self.after_s and bool(self.limits_kw())

    def fallback_event(self, program_name: str, limit_kw: float, now: datetime) -> Event:
        """The limit as a 3.1 event read like any other (a piece, from now)."""
        return Event.model_validate(
            {
                "id": event_id(program_name),
                "programID": event_id(program_name),
                "eventName": f"safe mode: {program_name}",
                "modificationDateTime": now.isoformat(),
                "intervalPeriod": {"start": now.isoformat(), "duration": f"PT{PIECE_S:g}S"},
                "payloadDescriptors": [
                    {"objectType": "EVENT_PAYLOAD_DESCRIPTOR", "payloadType": KIND, "units": "KW"}
                ],
                "intervals": [{"id": 0, "payloads": [{"type": KIND, "values": [limit_kw]}]}],
            }
        )
