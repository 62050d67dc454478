"""What each event shed at the meter, and a ceiling's averaging intervals against its limit."""

from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import or_
from sqlmodel import Session, col, select

from gateway.store.models import DeliveryRow, EventRow


def add_delivery_sample(
    session: Session,
    *,
    event_id: str,
    meter_source: str,
    at: datetime,
    seconds: float,
    requested_kw: float,
    delivered_kw: float,
) -> None:
    """Add one sample of an event's delivery at the meter, `seconds` long."""
    row = session.get(DeliveryRow, event_id)
    if row is None:
        row = DeliveryRow(
            event_id=event_id,
            meter_source=meter_source,
            first_at=at,
            last_at=at,
            samples=0,
            seconds=0.0,
            requested_kws=0.0,
            delivered_kws=0.0,
        )
    row.meter_source, row.last_at, row.samples = meter_source, at, row.samples + 1
    row.seconds += seconds
    row.requested_kws += requested_kw * seconds
    row.delivered_kws += delivered_kw * seconds
    session.add(row)


def add_limit_interval(session: Session, *, event_id: str, limit_kw: float, mean_kw: float) -> None:
    """Count one averaging interval of a ceiling event, judged against its limit."""
    row = session.get(DeliveryRow, event_id)
    if row is None:
        return  # no sample yet: nothing was measured
    row.limit_kw = limit_kw
    row.limit_intervals = (row.limit_intervals or 0) + 1
    row.limit_intervals_above = (row.limit_intervals_above or 0) + int(mean_kw > limit_kw)
    row.limit_worst_kw = max(row.limit_worst_kw or -math.inf, mean_kw)
    session.add(row)


def deliveries(session: Session, *, event_ids: list[str]) -> dict[str, DeliveryRow]:
    rows = session.exec(select(DeliveryRow).where(col(DeliveryRow.event_id).in_(event_ids)))
    return {row.event_id: row for row in rows}


def latest_deliveries(
    session: Session, *, statuses: tuple[str, ...], limit: int
) -> list[DeliveryRow]:
    """The deliveries of the last `limit` events in `statuses` not judged infeasible when
    planned, the last measured first."""
    feasible = col(EventRow.feasible)
    query = (
        select(DeliveryRow)
        .join(EventRow, col(EventRow.id) == col(DeliveryRow.event_id))
        .where(col(EventRow.status).in_(statuses), or_(feasible.is_(None), feasible.is_(True)))
        .order_by(col(DeliveryRow.last_at).desc(), col(DeliveryRow.event_id).desc())
        .limit(limit)
    )
    return list(session.exec(query))
