"""`/v1/plans/{id}`: a plan as stored, with each node's last answer."""

from __future__ import annotations

from fastapi import Response

from agents.protocol import problems
from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas.plans import Plan

router = v1_router()


@router.get("/plans/{plan_id}", response_model=Plan, responses=problems(404, 422))
async def get_plan(plan_id: str, services: ServicesDep) -> Response:
    # Built by the service (once per fan-out for the current plan), as `Plan` describes it.
    return Response(await services.targets.plan_json(plan_id), media_type="application/json")
