"""Persistence functions, keyword-only, one small function per question (store layer)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, delete, func, select

from flexmodel.calibration import OverheadCalibration
from gateway.store.models import (
    INTERVAL_LENGTHS_S,
    AuditRow,
    CalibrationRow,
    CommandRow,
    Counter,
    DeliveryRow,
    EventRow,
    JobCurveRow,
    JobRow,
    MeterInterval,
    MeterIntervalRow,
    MeterSample,
    MeterSampleRow,
    NodeRow,
    PfiRecordRow,
    PlanRow,
    epoch_ms,
    from_epoch_ms,
)


def load_jobs(session: Session) -> list[dict[str, Any]]:
    return [row.doc for row in session.exec(select(JobRow).order_by(col(JobRow.position)))]


def replace_jobs(session: Session, *, docs: list[dict[str, Any]]) -> None:
    session.exec(delete(JobRow))
    for position, doc in enumerate(docs):
        session.add(JobRow(id=doc["id"], doc=doc, position=position))


def put_job(session: Session, *, doc: dict[str, Any]) -> bool:
    """Insert or replace one job; True when it is new."""
    row = session.get(JobRow, doc["id"])
    if row is None:
        last = session.exec(select(JobRow).order_by(col(JobRow.position).desc())).first()
        session.add(
            JobRow(id=doc["id"], doc=doc, position=0 if last is None else last.position + 1)
        )
        return True
    row.doc = doc
    session.add(row)
    return False


def delete_job(session: Session, *, job_id: str) -> bool:
    row = session.get(JobRow, job_id)
    if row is None:
        return False
    session.delete(row)
    return True


def saw_node(session: Session, *, node_id: str, url: str, at: datetime) -> None:
    """Remember an agent and when it last answered."""
    row = session.get(NodeRow, node_id) or NodeRow(node_id=node_id, url=url, last_seen=at)
    row.url, row.last_seen = url, at
    session.add(row)


def list_nodes(session: Session) -> list[NodeRow]:
    return list(session.exec(select(NodeRow).order_by(col(NodeRow.node_id))))


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


def add_plan(session: Session, *, plan: PlanRow) -> None:
    session.add(plan)


def get_plan(session: Session, *, plan_id: str) -> PlanRow | None:
    return session.get(PlanRow, plan_id)


def newest_plan(session: Session) -> PlanRow | None:
    """The plan of the highest generation: what the agents were last sent."""
    return session.exec(select(PlanRow).order_by(col(PlanRow.generation).desc()).limit(1)).first()


def add_commands(session: Session, *, commands: list[dict[str, Any]]) -> None:
    """One fan-out's answers (`CommandRow` fields), in one statement: at 10,000 nodes an ORM
    object per row held the event loop three times as long."""
    if commands:
        session.execute(insert(CommandRow), commands)


def latest_commands(session: Session, *, plan_id: str) -> list[CommandRow]:
    """Each node's last answer to the plan (every reconciliation adds one per node)."""
    last = (
        select(func.max(CommandRow.id))
        .where(CommandRow.plan_id == plan_id)
        .group_by(col(CommandRow.node))
    )
    return list(session.exec(select(CommandRow).where(col(CommandRow.id).in_(last))))


def next_generation(session: Session) -> int:
    """A generation number higher than any the gateway has sent (kept across restarts)."""
    row = session.get(Counter, "generation")
    if row is None:
        row = Counter(name="generation", value=0)
    row.value += 1
    session.add(row)
    return row.value


def audit(
    session: Session, *, actor: str, action: str, detail: dict[str, Any], at: datetime
) -> None:
    session.add(AuditRow(at=at, actor=actor, action=action, detail=detail))


def latest_audit(session: Session, *, actions: tuple[str, ...]) -> AuditRow | None:
    """The newest audit entry of one of these actions, or None."""
    query = (
        select(AuditRow).where(col(AuditRow.action).in_(actions)).order_by(col(AuditRow.id).desc())
    )
    return session.exec(query).first()


def add_calibration(
    session: Session,
    *,
    fit: OverheadCalibration,
    meter_source: str,
    at: datetime,
) -> CalibrationRow:
    row = CalibrationRow(
        at=at,
        meter_source=meter_source,
        k=fit.k,
        k_stderr=fit.k_stderr,
        static_kw=fit.static_kw,
        static_stderr_kw=fit.static_stderr_kw,
        lag_s=fit.path.half_rise_s,
        points=fit.points,
        dead_s=fit.path.dead_s,
        dead_stderr_s=fit.path.dead_stderr_s,
        tau_s=fit.path.tau_s,
        tau_stderr_s=fit.path.tau_stderr_s,
        averaging_s=fit.path.averaging_s,
        path_source=fit.path.source,
    )
    session.add(row)
    return row


def latest_calibration(session: Session) -> CalibrationRow | None:
    """The newest fit (by its time, then by insertion), or None before the first."""
    query = select(CalibrationRow).order_by(
        col(CalibrationRow.at).desc(), col(CalibrationRow.id).desc()
    )
    return session.exec(query).first()


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


def add_job_curve(session: Session, *, curve: JobCurveRow) -> None:
    session.add(curve)


def latest_job_curves(session: Session) -> dict[str, JobCurveRow]:
    """Each job's latest curve, by job id."""
    latest = (
        select(JobCurveRow.job_id, func.max(JobCurveRow.id).label("id"))
        .group_by(col(JobCurveRow.job_id))
        .subquery()
    )
    rows = session.exec(select(JobCurveRow).join(latest, col(JobCurveRow.id) == latest.c.id))
    return {row.job_id: row for row in rows}


def put_pfi_records(session: Session, *, rows: list[PfiRecordRow]) -> None:
    """Each row replaces the job's record, if it has one."""
    for row in rows:
        old = session.get(PfiRecordRow, row.job_id)
        if old is not None:
            session.delete(old)
            session.flush()
        session.add(row)


def load_pfi_records(session: Session) -> list[PfiRecordRow]:
    return list(session.exec(select(PfiRecordRow).order_by(col(PfiRecordRow.job_id))))


def add_meter_samples(session: Session, *, rows: list[dict[str, Any]]) -> None:
    """A batch of the site's samples (`MeterSampleRow` fields), in one statement; a sample at
    a millisecond already stored (a wall clock stepped back) is dropped."""
    if not rows:
        return
    table = MeterSampleRow.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    statement: Any
    if dialect == "sqlite":
        statement = sqlite.insert(table).on_conflict_do_nothing(index_elements=["at_ms"])
    elif dialect == "postgresql":
        statement = postgresql.insert(table).on_conflict_do_nothing(index_elements=["at_ms"])
    else:  # pragma: no cover - the store runs on the two above
        statement = insert(table)
    session.execute(statement, rows)


def mark_meter_fault(session: Session, *, since_ms: int, until_ms: int) -> None:
    """Mark the stored samples in [since_ms, until_ms) as taken while the meter was faulted
    (a suspicion dates from before it was raised)."""
    column = col(MeterSampleRow.at_ms)
    session.execute(
        update(MeterSampleRow).where(column >= since_ms, column < until_ms).values(fault=True)
    )


def meter_sample_tuples(
    session: Session, *, start_ms: int, end_ms: int
) -> list[tuple[int, float, bool, bool]]:
    """(at_ms, kw, estimated, fault) of the samples in [start_ms, end_ms), oldest first: what
    the intervals are rolled up from."""
    table = MeterSampleRow.__table__  # type: ignore[attr-defined]
    query = (
        sa_select(table.c.at_ms, table.c.kw, table.c.estimated, table.c.fault)
        .where(table.c.at_ms >= start_ms, table.c.at_ms < end_ms)
        .order_by(table.c.at_ms)
    )
    return [(r[0], r[1], bool(r[2]), bool(r[3])) for r in session.connection().execute(query)]


def first_meter_sample_ms(session: Session) -> int | None:
    return session.exec(select(func.min(MeterSampleRow.at_ms))).one()


def meter_intervals_closed(session: Session) -> dict[int, int]:
    """Per interval length [s], the end of the last interval stored [ms since the epoch]."""
    query = select(MeterIntervalRow.length_s, func.max(MeterIntervalRow.start_ms)).group_by(
        col(MeterIntervalRow.length_s)
    )
    return {length_s: start_ms + length_s * 1000 for length_s, start_ms in session.exec(query)}


def replace_meter_intervals(
    session: Session, *, length_s: int, start_ms: int, end_ms: int, rows: Iterable[dict[str, Any]]
) -> None:
    """The intervals of `length_s` starting in [start_ms, end_ms) are these
    (`MeterIntervalRow` fields): any stored before are replaced."""
    session.exec(
        delete(MeterIntervalRow).where(
            col(MeterIntervalRow.length_s) == length_s,
            col(MeterIntervalRow.start_ms) >= start_ms,
            col(MeterIntervalRow.start_ms) < end_ms,
        )
    )
    batch = list(rows)
    if batch:
        session.execute(insert(MeterIntervalRow), batch)


def prune_meter_history(
    session: Session, *, samples_before: datetime, intervals_before: datetime
) -> None:
    """Forget samples taken before `samples_before` and intervals that began before
    `intervals_before`."""
    session.exec(delete(MeterSampleRow).where(col(MeterSampleRow.at_ms) < epoch_ms(samples_before)))
    session.exec(
        delete(MeterIntervalRow).where(col(MeterIntervalRow.start_ms) < epoch_ms(intervals_before))
    )


def meter_intervals(
    session: Session, *, start: datetime, end: datetime, length_s: int
) -> list[MeterInterval]:
    """The meter history's intervals of `length_s` (60, 300, 900 or 1800 s, aligned on UTC)
    that overlap [start, end), oldest first, every one of them: an interval with nothing
    stored (no sample, or not closed yet) is a gap, with no mean and coverage 0. Reads only."""
    if length_s not in INTERVAL_LENGTHS_S:
        raise ValueError(f"interval length {length_s} s is not one of {INTERVAL_LENGTHS_S}")
    step_ms = length_s * 1000
    first_ms = epoch_ms(start) // step_ms * step_ms
    end_ms = epoch_ms(end)
    query = (
        select(MeterIntervalRow)
        .where(
            col(MeterIntervalRow.length_s) == length_s,
            col(MeterIntervalRow.start_ms) >= first_ms,
            col(MeterIntervalRow.start_ms) < end_ms,
        )
        .order_by(col(MeterIntervalRow.start_ms))
    )
    stored = {row.start_ms: row for row in session.exec(query)}
    out = []
    for start_ms in range(first_ms, end_ms, step_ms):
        row = stored.get(start_ms)
        begins, ends = from_epoch_ms(start_ms), from_epoch_ms(start_ms + step_ms)
        if row is None:
            out.append(MeterInterval(begins, ends, None, 0, 0.0, True, 0.0, False, False))
            continue
        out.append(
            MeterInterval(
                begins,
                ends,
                row.mean_kw,
                row.samples,
                row.coverage,
                row.gap,
                row.estimated_share,
                row.estimated,
                row.fault,
            )
        )
    return out


def meter_samples(
    session: Session, *, start: datetime, end: datetime, limit: int | None = None
) -> list[MeterSample]:
    """The raw samples taken in [start, end), oldest first (at most `limit`)."""
    column = col(MeterSampleRow.at_ms)
    query = (
        select(MeterSampleRow)
        .where(column >= epoch_ms(start), column < epoch_ms(end))
        .order_by(column)
    )
    if limit is not None:
        query = query.limit(limit)
    return [
        MeterSample(from_epoch_ms(r.at_ms), r.kw, r.estimated, r.fault) for r in session.exec(query)
    ]
