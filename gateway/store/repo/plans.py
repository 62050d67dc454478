"""Plans, the nodes' answers to each, and the generation counter kept across restarts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert
from sqlmodel import Session, col, func, select

from gateway.store.models import CommandRow, Counter, PlanRow


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
