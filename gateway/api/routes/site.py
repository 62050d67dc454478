"""The site now: `/v1/site` (power at the meter), `/v1/nodes` (agents), `/v1/sync` (phases)."""

from __future__ import annotations

from typing import Any

from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas import SiteState, SyncState
from gateway.services.planner import loops_report
from gateway.units import rounded

router = v1_router()


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


@router.get("/nodes")
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
