"""`/v1/plans/{id}`: a plan as stored, with each node's last answer."""

from __future__ import annotations

from typing import Any

from agents.protocol import problems
from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas import Plan
from gateway.units import rounded

router = v1_router()


@router.get("/plans/{plan_id}", response_model=Plan, responses=problems(404, 422))
async def get_plan(plan_id: str, services: ServicesDep) -> dict[str, Any]:
    return rounded(await services.targets.plan_doc(plan_id))
