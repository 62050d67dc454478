"""Events as stored: added, replaced by a newer modification, linked to their plan, read."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select as sa_select
from sqlmodel import Session, col, select

from gateway.store.models import EventRow


def add_event(session: Session, *, event: EventRow) -> None:
    session.add(event)


def replace_event(session: Session, *, event: EventRow) -> None:
    """Store the event in place of the one with its id, if any (a newer modification)."""
    known = session.get(EventRow, event.id)
    if known is not None:
        session.delete(known)
        session.flush()
    session.add(event)


def link_plan(session: Session, *, event_id: str, plan_id: str) -> None:
    """The event's current plan is this one."""
    event = session.get(EventRow, event_id)
    if event is not None:
        event.plan_id = plan_id
        session.add(event)


def get_event(session: Session, *, event_id: str) -> EventRow | None:
    return session.get(EventRow, event_id)


def list_events(session: Session, *, statuses: tuple[str, ...] | None = None) -> list[EventRow]:
    query = select(EventRow).order_by(col(EventRow.start))
    if statuses:
        query = query.where(col(EventRow.status).in_(statuses))
    return list(session.exec(query))


def event_rows(session: Session, limit: int | None = None) -> list[Any]:
    """Every event by start (then id), or the last `limit` of them, as plain rows
    (attributes named as `EventRow`'s): what a listing reads, without building an ORM object
    per event (half the cost)."""
    table = EventRow.__table__  # type: ignore[attr-defined]
    if limit is None:
        every = sa_select(table).order_by(table.c.start, table.c.id)
        return list(session.connection().execute(every))
    latest = sa_select(table).order_by(table.c.start.desc(), table.c.id.desc()).limit(limit)
    return list(reversed(list(session.connection().execute(latest))))
