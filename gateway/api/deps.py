"""Dependencies of the routes: the services, and the bearer tokens."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from agents.protocol import problems
from gateway.errors import UnauthorizedError
from gateway.services.characterise import Characteriser
from gateway.services.curves import JobCurves
from gateway.services.eventdocs import EventDocs
from gateway.services.events import Events
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.jobfeed import JobFeed
from gateway.services.meterhistory import MeterHistory
from gateway.services.predictions import Predictions
from gateway.services.quotes import Quotes
from gateway.services.scattering import Scatterer
from gateway.services.settlement import Settlement
from gateway.services.site import SitePower
from gateway.services.status import Status
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settings import GatewaySettings


@dataclass(frozen=True)
class Services:
    """What the routes call, built by `gateway.app.create_app`."""

    book: JobBook
    fleet: Fleet
    power: SitePower
    targets: Targets
    tracker: Tracker
    quotes: Quotes
    events: Events
    event_docs: EventDocs
    status: Status
    scatterer: Scatterer
    feed: JobFeed | None = None  #: the scheduler the jobs follow; None: the static mix
    curves: JobCurves | None = None
    characteriser: Characteriser | None = None
    predictions: Predictions | None = None  #: PFIs predicted from telemetry
    meter_history: MeterHistory | None = None  #: the site's samples and intervals
    settlement: Settlement | None = None  #: events settled under the program's baselines


# Coroutines, not plain functions: FastAPI runs a plain function dependency in a worker
# thread, a thread hop on every request for two attribute reads.
async def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


ServicesDep = Annotated[Services, Depends(_services)]
SettingsDep = Annotated[GatewaySettings, Depends(_settings)]


def _matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


async def write_access(
    settings: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> str:
    """Every mutating call: the API token."""
    if not _matches(authorization, settings.api_token.get_secret_value()):
        raise UnauthorizedError("a valid bearer token (FLEXGATE_API_TOKEN) is required")
    return "api"


async def read_access(
    settings: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Reads (and quotes): open unless FLEXGATE_READ_TOKEN is set; the API token works too."""
    read = settings.read_token
    if read is None or not read.get_secret_value():
        return
    if not (
        _matches(authorization, read.get_secret_value())
        or _matches(authorization, settings.api_token.get_secret_value())
    ):
        raise UnauthorizedError("a valid bearer token (FLEXGATE_READ_TOKEN) is required")


Writer = Annotated[str, Depends(write_access)]
READ = [Depends(read_access)]


def v1_router() -> APIRouter:
    """A router for one resource under /v1: readers need the read token when one is set."""
    return APIRouter(prefix="/v1", dependencies=READ, responses=problems(401, 503))
