"""Each job's measured curves, and the PFI records the predictor refits on."""

from __future__ import annotations

from sqlmodel import Session, col, func, select

from gateway.store.models import JobCurveRow, PfiRecordRow


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
