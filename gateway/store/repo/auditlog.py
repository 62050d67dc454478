"""The audit log: who did what, when."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from gateway.store.models import AuditRow


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
