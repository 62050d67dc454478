"""Events as stored: read by id or status, and moved from one status to the next, each move
audited. What acts on them is `gateway.services.events`."""

from __future__ import annotations

from typing import Any

from gateway.clock import Clock
from gateway.errors import NotFoundError
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import EventRow

LIVE = ("pending", "active")


class EventRecords:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store, self.clock = store, clock

    def get(self, event_id: str) -> EventRow:
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
        if event is None:
            raise NotFoundError(f"no event '{event_id}'")
        return event

    def live(self) -> list[EventRow]:
        with self.store.session() as s:
            return repo.list_events(s, statuses=LIVE)

    def active(self) -> list[EventRow]:
        """The active events that act on the site (test events never do)."""
        with self.store.session() as s:
            return [e for e in repo.list_events(s, statuses=("active",)) if not e.test]

    def all(self, limit: int | None = None) -> list[Any]:
        """Every event by start, or the last `limit`, as plain rows with `EventRow`'s
        attributes (for `EventDocs.describe`)."""
        with self.store.session() as s:
            return repo.event_rows(s, limit)

    def _move(
        self,
        event_id: str,
        sources: tuple[str, ...],
        target: str,
        actor: str = "scheduler",
        baseline_kw: float | None = None,
    ) -> bool:
        """Move the event to status `target` if its status is one of `sources`; whether it
        moved."""
        with self.store.session() as s:
            event = repo.get_event(s, event_id=event_id)
            if event is None or event.status not in sources:
                return False
            event.status = target
            if baseline_kw is not None:
                event.baseline_kw = baseline_kw
            s.add(event)
            self._audit(s, actor, f"events.{target}", {"id": event_id})
            s.commit()
        return True

    def _audit(self, session: Any, actor: str, action: str, detail: dict[str, Any]) -> None:
        repo.audit(session, actor=actor, action=action, detail=detail, at=self.clock.now())
