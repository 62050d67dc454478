"""The site: `/v1/site` (power at the meter now), `/v1/site/meter` (its history),
`/v1/nodes` (agents), `/v1/sync` (phases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import Query

from agents.protocol import problems
from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas.site import MeterHistoryDoc, Nodes, SiteState, SyncState
from gateway.errors import InvalidRequestError
from gateway.services.planner import loops_report
from gateway.units import rounded

router = v1_router()

#: `interval` of `GET /v1/site/meter` and its length [s].
INTERVALS = {"1m": 60, "5m": 300, "15m": 900, "30m": 1800}
#: The most intervals (or raw samples) one answer holds.
MAX_POINTS = 20_000
#: Without `start`, the span asked for ends this long before `end`.
DEFAULT_SPAN = timedelta(hours=1)
#: The times a history can hold: after the Unix epoch, well before the calendar's end.
EARLIEST, LATEST = datetime(1970, 1, 2, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)


@router.get("/site", response_model=SiteState)
async def site(services: ServicesDep) -> dict[str, Any]:
    strictest = services.events.strictest()
    return rounded(
        {
            **await services.power.doc(),
            "active_event_id": strictest[0].id if strictest else None,
            "tracking": services.tracker.doc(),
            "recovering": services.targets.recovering,
            "recovering_from_event_id": (
                services.targets.recovering_from if services.targets.recovering else None
            ),
        }
    )


# Documented, not validated again: at 10,000 nodes the dashboard polls it, and validating the
# list cost 40% more than building and sending it.
@router.get(
    "/nodes", response_model=None, responses={200: {"model": Nodes, "description": "the nodes"}}
)
async def nodes(services: ServicesDep) -> dict[str, Any]:
    return {"nodes": await services.fleet.node_docs()}


@router.get("/sync", response_model=SyncState)
async def sync(services: ServicesDep) -> dict[str, Any]:
    mix = services.book.mix()
    measured = services.fleet.loop_measurements()
    return {
        **await services.fleet.phase_doc(),
        **loops_report(mix, measured, services.tracker.loop_model(mix)),
        "scattering": services.scatterer.doc(),
        "oscillation": await services.scatterer.oscillation.check(),
    }


@router.get("/site/meter", response_model=MeterHistoryDoc, responses=problems(422))
async def meter_history(
    services: ServicesDep,
    start: Annotated[
        datetime | None, Query(description="ISO 8601 with a UTC offset; default: end - 1 h")
    ] = None,
    end: Annotated[
        datetime | None, Query(description="ISO 8601 with a UTC offset; default: now")
    ] = None,
    interval: Annotated[
        Literal["1m", "5m", "15m", "30m", "raw"], Query(description="interval length, or raw")
    ] = "1m",
) -> dict[str, Any]:
    """The facility meter's history (docs/operations.md, "Meter history"): the closed
    intervals overlapping [start, end), gaps included, or the raw samples taken in it."""
    history = services.meter_history
    assert history is not None
    for name, when in (("start", start), ("end", end)):
        if when is not None and when.utcoffset() is None:
            raise InvalidRequestError(
                f"{name}: {when.isoformat()} has no UTC offset; give one (2026-11-03T00:00:00Z)"
            )
        if when is not None and not EARLIEST <= when <= LATEST:
            raise InvalidRequestError(
                f"{name}: {when.isoformat()} is outside {EARLIEST.year} to {LATEST.year}"
            )
    end = end or history.clock.now()
    start = start or end - DEFAULT_SPAN
    if end <= start:
        raise InvalidRequestError(f"end: {end.isoformat()} is not after start {start.isoformat()}")
    length_s = INTERVALS.get(interval)
    if length_s is not None and (end - start) / timedelta(seconds=length_s) > MAX_POINTS:
        _too_many(interval)
    doc = await history.doc(start=start, end=end, length_s=length_s, limit=MAX_POINTS + 1)
    if len(doc.get("samples") or ()) > MAX_POINTS:
        _too_many(interval)
    return rounded({"interval": interval, "source": services.power.source, **doc})


def _too_many(interval: str) -> None:
    raise InvalidRequestError(
        f"end: the span from start to end holds more than {MAX_POINTS} {interval} points, "
        "more than one answer gives; ask for a shorter span or a longer interval"
    )
