"""The site's measured PFI records, the predictor's own data (a table of its own, so the
schema version and the other tables stay as they are: `create_all` adds it where missing).

One row per job: its DRAM copy product over the uncapped run, its measured PFI (Eq. 1 on a
sweep, on the grid `grid_w`), its model family (the predictor's group), where the PFI came
from (`source`: `sweep` for a job-mix sweep, or the name a measurement service gives), when.
A job measured again replaces its row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime
from sqlmodel import Field, Session, SQLModel, col, select

from flexmodel.predictor import PfiRecord


class PfiRecordRow(SQLModel, table=True):
    __tablename__ = "pfi_records"
    job_id: str = Field(primary_key=True)
    feature: float  #: DRAM copy product, uncapped [0-1]
    pfi: float  #: measured
    model_family: str  #: the predictor's group
    source: str  #: `sweep`, or the measuring service's name
    grid_w: list[float] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


def put_records(session: Session, *, rows: list[PfiRecordRow]) -> None:
    for row in rows:
        old = session.get(PfiRecordRow, row.job_id)
        if old is not None:
            session.delete(old)
            session.flush()
        session.add(row)


def load_records(session: Session) -> list[PfiRecordRow]:
    return list(session.exec(select(PfiRecordRow).order_by(col(PfiRecordRow.job_id))))


def as_record(row: PfiRecordRow) -> PfiRecord:
    return PfiRecord(feature=row.feature, pfi=row.pfi, group=row.model_family, job_id=row.job_id)


def row_doc(row: PfiRecordRow) -> dict[str, Any]:
    return {
        "job_id": row.job_id,
        "feature": row.feature,
        "pfi": row.pfi,
        "model_family": row.model_family,
        "source": row.source,
        "grid_w": row.grid_w,
        "at": row.at.isoformat(),
    }
