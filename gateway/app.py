"""The gateway's composition root: `create_app(settings)` builds every service and wires them.

The outside world comes in as parts: the clock, the agent transport (HTTP unless given), the
grid protocol (OpenADR 2.0b or 3.1 when a VTN is configured: FLEXGATE_OPENADR) and the job
source (a scheduler, when `FLEXGATE_JOB_SOURCE` names one); tests pass their own. The 3.1 VEN
is built with the app, because the gateway serves its webhook.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from agents.protocol import validation_detail
from flexmodel.errors import FlexModelError
from gateway.agentclient import AgentClient
from gateway.agentclient.fast import FastTransport, HttpFast, MemoryFast
from gateway.agentclient.http import HttpAgentClient, HttpTrace
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.api.deps import Services
from gateway.api.routes import routers
from gateway.clock import Clock, SystemClock
from gateway.errors import GatewayError
from gateway.jobsource import JobSource
from gateway.jobsource.slurm import SlurmSource
from gateway.meter.frequency import open_frequency
from gateway.openadr.programbaseline import ProgramBaseline
from gateway.services.characterise import Characteriser
from gateway.services.curves import JobCurves
from gateway.services.delivery import Deliveries
from gateway.services.eventdocs import EventDocs
from gateway.services.events import Events
from gateway.services.fast import FastPath
from gateway.services.fleet import Fleet
from gateway.services.frequency import FrequencyTrigger
from gateway.services.jobbook import JobBook
from gateway.services.jobfeed import JobFeed
from gateway.services.meterhistory import MeterHistory
from gateway.services.oscillation import OscillationWatch
from gateway.services.overhead import Overhead
from gateway.services.predictions import Predictions
from gateway.services.quotes import Quotes
from gateway.services.reconciler import Reconciler
from gateway.services.scattering import Scatterer
from gateway.services.settlement import Settlement
from gateway.services.site import SitePower, open_feed
from gateway.services.status import Status
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settings import GatewaySettings, get_settings
from gateway.store.db import Store

if TYPE_CHECKING:
    from gateway.agentclient.natsbus import NatsOptions

log = logging.getLogger("flexgate.gateway")


def create_app(
    settings: GatewaySettings | None = None,
    *,
    clock: Clock | None = None,
    agents: AgentClient | None = None,
    http_trace: HttpTrace = (),
    job_source: JobSource | None = None,
) -> FastAPI:
    """The gateway. `http_trace` sees every request of its own HTTP clients (agents, VTN);
    `job_source` replaces the one `FLEXGATE_JOB_SOURCE` names."""
    settings = settings or get_settings()
    clock = clock or SystemClock()
    ven31 = None
    if settings.vtn_url and settings.openadr == "3.1":
        from gateway.openadr.ven31 import Ven31

        ven31 = Ven31(settings, clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = agents or await agent_client(settings, clock, http_trace)
        parts = _wire(settings, clock, client, ven31, http_trace, job_source)
        app.state.fast, app.state.frequency = parts.fast, parts.frequency
        app.state.services = parts.services
        await parts.start(settings)
        try:
            yield
        finally:
            await parts.stop()

    app = FastAPI(
        title="flexgate gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Demand response for AI data centres: quotes, events, plans, caps.",
    )
    app.state.settings = settings
    for router in routers:
        app.include_router(router)
    if ven31 is not None:
        app.include_router(ven31.webhook.router())

    _add_error_handlers(app)
    return app


@dataclass(frozen=True)
class _Parts:
    """What the app starts and stops, wired (`_wire`)."""

    client: AgentClient
    store: Store
    ven: Any  #: the grid protocol's VEN (2.0b or 3.1), None without a VTN
    services: Services
    fleet: Fleet
    power: SitePower
    targets: Targets
    events: Events
    reconciler: Reconciler
    feed: JobFeed | None
    curves: JobCurves
    characteriser: Characteriser
    predictions: Predictions
    history: MeterHistory
    settlement: Settlement
    fast: FastPath
    frequency: FrequencyTrigger

    async def start(self, settings: GatewaySettings) -> None:
        await self.fleet.discover()
        self.curves.start()  # before events resume: plans use the measured curves in force
        await self.events.start()
        self.reconciler.start()
        self.characteriser.start()
        self.power.start()
        self.history.start()
        self.predictions.start()
        await self.fast.start()
        self.frequency.start()  # refused (the gateway stops) beyond the droop's phase bound
        if self.feed is not None:
            self.feed.start()
        if self.ven is not None:
            rule = settings.report_baseline
            baseline = ProgramBaseline(rule, self.settlement, self.history) if rule else None
            await self.ven.start(self.events, self.power, baseline, self.fast)

    async def stop(self) -> None:
        if self.ven is not None:
            await self.ven.stop()
        if self.feed is not None:
            await self.feed.stop()
        self.characteriser.stop()
        self.curves.stop()
        self.reconciler.stop()
        self.predictions.stop()
        await self.frequency.stop()
        self.fast.stop()
        self.power.stop()
        await self.history.stop()  # after the site's last sample: everything given is written
        self.targets.stop()
        self.fleet.stop()
        self.events.stop()
        await self.client.close()
        self.store.close()


def _wire(
    settings: GatewaySettings,
    clock: Clock,
    client: AgentClient,
    ven31: Any,
    http_trace: HttpTrace,
    job_source: JobSource | None,
) -> _Parts:
    """Every service built and subscribed to what it listens to; nothing started."""
    store = Store(settings.database_url)
    ven: Any = ven31
    if settings.vtn_url and ven31 is None:
        from gateway.openadr.ven import Ven  # openleadr loads only when a VTN is configured

        ven = Ven(settings, tuple(http_trace), clock)
    fleet = Fleet(settings, store, clock, client)
    overhead = Overhead(settings, store, clock)
    source = job_source or open_job_source(settings, fleet)
    book = JobBook(store, clock, overhead, settings.tier_table, source.kind if source else None)
    power = SitePower(settings, clock, fleet, book, overhead, open_feed(settings, clock=clock))
    targets = Targets(settings, store, clock, client, fleet, book, power)
    tracker = Tracker(settings, clock, power, targets, book, fleet)
    # first of the site's listeners: a sample is kept whatever the others do with it
    history = MeterHistory(settings, store, clock, power)
    if settings.meter_history:
        power.subscribe(history.on_sample)
    fast = FastPath(
        settings, store, clock, fleet, book, fast_transport(client, clock), release=targets
    )
    power.subscribe(fast.hold(tracker.step))  # the loop holds while a fast event lasts
    hz_feed = open_frequency(settings.frequency_url, timeout_s=settings.frequency_timeout_s)
    frequency = FrequencyTrigger(settings, clock, fast, hz_feed)
    power.subscribe(Deliveries(store, clock, power, tracker).sample)
    quotes = Quotes(settings, store, book, fleet)
    events = Events(settings, store, clock, book, power, quotes, targets, tracker, ven)
    book.subscribe(events.apply_targets)
    book.subscribe(fast.changed)
    oscillation = OscillationWatch(settings, power, fleet, book)
    scatterer = Scatterer(settings, clock, fleet, targets, tracker, oscillation)
    reconciler = Reconciler(settings.reconcile_period_s, clock, fleet, targets, events, scatterer)
    feed = JobFeed(settings, clock, book, fleet, source) if source else None
    status = Status(settings, fleet, book, power, targets, events, oscillation, feed)
    curves = JobCurves(settings, store, clock, book, fleet)
    characteriser = Characteriser(settings, store, clock, book, fleet, targets, events, curves)
    predictions = Predictions(settings, store, clock, fleet, book)
    settlement = Settlement(settings, store, clock)
    fast.register(status.registry)
    frequency.register(status.registry)
    event_docs = EventDocs(settings, store, clock, power, targets)
    services = Services(
        book, fleet, power, targets, tracker, quotes, events, event_docs, status, scatterer,
        feed, curves, characteriser, predictions, history, settlement,
    )  # fmt: skip
    return _Parts(
        client, store, ven, services, fleet, power, targets, events, reconciler, feed, curves,
        characteriser, predictions, history, settlement, fast, frequency,
    )  # fmt: skip


def _add_error_handlers(app: FastAPI) -> None:
    """Each error the services raise, answered as the API documents it."""

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(FlexModelError)
    async def model_error(_: Request, exc: FlexModelError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(OperationalError)
    async def store_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.warning("store unreachable: %s", exc.orig)
        detail = "the store is unreachable: nothing was changed; try again"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=422)


def open_job_source(settings: GatewaySettings, fleet: Fleet) -> JobSource | None:
    """The scheduler `FLEXGATE_JOB_SOURCE` names; None for the static mix. Kubernetes pods'
    GPU indices come from the fleet (each agent reads its kubelet's)."""
    if settings.job_source == "slurm":
        return SlurmSource(timeout_s=settings.job_source_timeout_s, bin_dir=settings.slurm_bin_dir)
    if settings.job_source == "kubernetes":
        from gateway.jobsource.kubernetes import KubernetesSource, open_api  # loads the client

        return KubernetesSource(
            open_api(settings.kubernetes_kubeconfig),
            fleet.pod_gpus,
            timeout_s=settings.job_source_timeout_s,
            namespace=settings.kubernetes_namespace,
            watch_s=settings.kubernetes_watch_s,
        )
    return None


async def agent_client(
    settings: GatewaySettings, clock: Clock, http_trace: HttpTrace, *, read_only: bool = False
) -> AgentClient:
    """The transport `FLEXGATE_TRANSPORT` names: HTTP, or NATS (connected here, so wrong
    credentials stop the gateway at start with the reason). `read_only`: NATS's desired-state
    bucket is neither made nor fitted (the doctor only asks the agents' health)."""
    # One token shared by every agent, or each node's own (FLEXGATE_NODE_TOKEN_SECRET).
    token = settings.token_for if settings.node_token_secret is not None else settings.token_for("")
    if settings.transport == "http":
        return HttpAgentClient(
            token,
            timeout_s=settings.dispatch_timeout_s,
            retries=settings.dispatch_retries,
            clock=clock,
            trace_configs=http_trace,
            ca_file=settings.agents_ca,
        )
    from gateway.agentclient.natsbus import NatsAgentClient  # nats-py on demand

    client = NatsAgentClient(
        nats_options(settings),
        token,
        timeout_s=settings.dispatch_timeout_s,
        retries=settings.dispatch_retries,
        lease_s=settings.lease_s,
        clock=clock,
    )
    await client.connect(read_only=read_only)
    return client


def fast_transport(client: AgentClient, clock: Clock) -> FastTransport:
    """The fast path over the agents' own transport (`agent_client`'s)."""
    if isinstance(client, HttpAgentClient):
        return HttpFast(client, clock)
    if isinstance(client, InMemoryAgentClient):
        return MemoryFast(client, clock)
    from gateway.agentclient.natsbus import NatsAgentClient  # nats-py on demand
    from gateway.agentclient.natsfast import NatsFast

    if isinstance(client, NatsAgentClient):
        return NatsFast(client, clock)
    raise TypeError(f"no fast path over {type(client).__name__}")


def nats_options(settings: GatewaySettings) -> NatsOptions:
    from gateway.agentclient.natsbus import NatsOptions

    token, password = settings.nats_token, settings.nats_password
    return NatsOptions(
        url=settings.nats_url,
        token=token.get_secret_value() if token else None,
        user=settings.nats_user,
        password=password.get_secret_value() if password else None,
        tls_ca=settings.nats_tls_ca,
    )
