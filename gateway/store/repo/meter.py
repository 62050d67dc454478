"""The meter history: the site's samples (written in batches, marked when the meter faulted)
and the intervals rolled up from them, pruned on time."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, delete, func, select

from gateway.store.models import (
    INTERVAL_LENGTHS_S,
    MeterInterval,
    MeterIntervalRow,
    MeterSample,
    MeterSampleRow,
    epoch_ms,
    from_epoch_ms,
)


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
