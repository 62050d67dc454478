"""The job mix as stored, in its order."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, delete, select

from gateway.store.models import JobRow


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
