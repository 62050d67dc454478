"""The overhead's calibrations on the meter."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from flexmodel.calibration import OverheadCalibration
from gateway.store.models import CalibrationRow


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
