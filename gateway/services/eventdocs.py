"""Events as the API shows them (`/v1/events`): each with the level it asks now, its plan's
feasibility, its delivery, its ramp and its settlement link (their lifecycle:
`gateway.services.events`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gateway.clock import Clock
from gateway.services.delivery import delivery_doc
from gateway.services.intervals import reduction_now
from gateway.services.settlement import settlement_link
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import as_utc, iso


class EventDocs:
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        power: SitePower,
        targets: Targets,
    ) -> None:
        self.settings, self.store, self.clock = settings, store, clock
        self.power, self.targets = power, targets
        self._feasible: dict[str, bool] = {}  #: plan id -> whether it met its target

    def describe(self, events: Sequence[Any]) -> list[dict[str, Any]]:
        """The events (`EventRow`s, or rows with their attributes) as the API shows them, each
        with its current plan's feasibility."""
        with self.store.session() as s:
            for plan_id in {e.plan_id for e in events if e.plan_id} - self._feasible.keys():
                row = repo.get_plan(s, plan_id=plan_id)  # a plan is never changed once stored
                if row is not None:
                    self._feasible[plan_id] = bool(row.doc["feasible"])
            when = self.clock.now()
            # A delivery is recorded while an event is active: none before its start.
            begun = [e.id for e in events if as_utc(e.start) <= when]
            deliveries = repo.deliveries(s, event_ids=begun) if begun else {}
        baseline_kw = self.power.envelope()[0]
        ramps = self.targets.ramp.reports
        out = []
        for event in events:
            intervals = event.intervals or []
            spans = [(_time(i["start"]), _time(i["end"]), i) for i in intervals]
            current = next((i for start, end, i in spans if start <= when < end), None)
            upcoming = next((i for start, _, i in spans if start > when), None)
            shown = current or upcoming or (intervals[-1] if intervals else None)
            if shown is current and current is not None:  # a level follows the load
                shown = {"reduction_kw": reduction_now(event, when, baseline_kw)}
            out.append(
                {
                    "id": event.id,
                    "source": event.source,
                    "status": event.status,
                    "start": iso(event.start),
                    "end": iso(event.end),
                    "reduction_kw": shown["reduction_kw"] if shown else event.reduction_kw,
                    "intervals": [
                        {**i, "plan_id": event.plan_id if i is current else None} for i in intervals
                    ],
                    "opt": event.opt,
                    "reason": event.reason,
                    "plan_id": event.plan_id,
                    "feasible": self._feasible.get(event.plan_id or "", event.feasible),
                    # Caps still stepping back after the event ended or was cancelled.
                    "recovering": self.targets.recovering
                    and self.targets.recovering_from == event.id,
                    "test": event.test,
                    "external_id": event.external_id,
                    "modification": event.modification,
                    "delivery": (
                        delivery_doc(deliveries[event.id]) if event.id in deliveries else None
                    ),
                    "ramp": ramps[event.id].doc() if event.id in ramps else None,
                    "settlement": settlement_link(self.settings, event.id, event.source),
                    "counted": getattr(event, "counted", None),
                }
            )
        return out


def _time(stored: str) -> datetime:
    """A stored interval's time (ISO, UTC) as a datetime: compared as times, not as text."""
    return as_utc(datetime.fromisoformat(stored))
