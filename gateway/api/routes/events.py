"""`/v1/events`: demand-response events, manual or from the grid protocol."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query
from fastapi.responses import JSONResponse

from agents.protocol import problems
from gateway.api.deps import ServicesDep, Writer, v1_router
from gateway.api.schemas.events import Event, EventCreate, Events
from gateway.api.schemas.settlement import Settlement

router = v1_router()
#: The most events one page of the list gives.
MAX_LIMIT = 10_000


@router.get("/events", response_model=Events, responses=problems(422))
async def list_events(
    services: ServicesDep,
    limit: Annotated[
        int | None,
        Query(ge=1, le=MAX_LIMIT, description="only the last this many events by start"),
    ] = None,
) -> JSONResponse:
    """Every event by start, or the last `limit` (the documented `Events` shape; sent as
    built, not validated again: the list grows with every event ever received, and its
    validation cost as much as building it)."""
    return JSONResponse({"events": services.event_docs.describe(services.events.all(limit))})


# One event is sent as built too (`Event`'s shape: the list's test holds `describe` to it).
@router.get("/events/{event_id}", response_model=Event, responses=problems(404, 422))
async def get_event(event_id: str, services: ServicesDep) -> JSONResponse:
    return JSONResponse(services.event_docs.describe([services.events.get(event_id)])[0])


@router.get(
    "/events/{event_id}/settlement", response_model=Settlement, responses=problems(404, 422)
)
async def event_settlement(
    event_id: str,
    services: ServicesDep,
    rules: Annotated[
        str | None,
        Query(max_length=200, description="baseline presets, comma-separated; default: the site's"),
    ] = None,
    interval_min: Annotated[
        int | None, Query(description="1, 5, 15, 30 or 60; default: the site's")
    ] = None,
) -> dict[str, Any]:
    """The event settled under each baseline rule (docs/operations.md, "Settlement")."""
    settlement = services.settlement
    assert settlement is not None
    return await settlement.doc(event_id, rules=rules, interval_min=interval_min)


@router.post("/events", status_code=201, response_model=Event, responses=problems(400, 422))
async def create_event(body: EventCreate, services: ServicesDep, actor: Writer) -> JSONResponse:
    events = services.events
    event = await events.create(
        reduction_kw=body.reduction_kw,
        start=body.start,
        duration_s=body.duration_s,
        source="manual",
        actor=actor,
        force=body.force,
    )
    return JSONResponse(services.event_docs.describe([event])[0], status_code=201)


@router.delete("/events/{event_id}", response_model=Event, responses=problems(404, 409, 422))
async def cancel_event(event_id: str, services: ServicesDep, actor: Writer) -> JSONResponse:
    cancelled = await services.events.cancel(event_id, actor)
    return JSONResponse(services.event_docs.describe([cancelled])[0])
