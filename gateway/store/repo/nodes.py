"""The agents known, and when each last answered."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from gateway.store.models import NodeRow


def saw_node(session: Session, *, node_id: str, url: str, at: datetime) -> None:
    """Remember an agent and when it last answered."""
    row = session.get(NodeRow, node_id) or NodeRow(node_id=node_id, url=url, last_seen=at)
    row.url, row.last_seen = url, at
    session.add(row)


def list_nodes(session: Session) -> list[NodeRow]:
    return list(session.exec(select(NodeRow).order_by(col(NodeRow.node_id))))
