"""`/health` (liveness and the store) and `/metrics` (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from agents.protocol import problems
from gateway.api.deps import READ, ServicesDep
from gateway.api.schemas.health import Health

router = APIRouter()


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "the store is unreachable"}},
)
async def health(services: ServicesDep) -> JSONResponse:
    """200 when the store answers (`ok`, or `degraded` with the reasons); 503 `unhealthy`
    (with the same fields) when it does not. Sent as built (`Health`'s shape, held to it by
    the tests): service managers and load balancers poll it."""
    doc = services.status.health()
    return JSONResponse(doc, status_code=503 if doc["status"] == "unhealthy" else 200)


@router.get(
    "/metrics", response_class=PlainTextResponse, dependencies=READ, responses=problems(401, 503)
)
async def metrics(services: ServicesDep) -> str:
    return services.status.metrics()
