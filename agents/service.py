"""The agent's HTTP service (docs/agents.md, "API summary"), FastAPI on uvicorn.

`AgentNode` is one node's composition: its backend, original limits, cap controller, sampler
and lease watcher. `create_app` serves one node at the root, or several simulated nodes in one
process under `/nodes/{node_id}` (the gateway's scale benchmark): the base URL of node N is
`http://host:port/nodes/N`.

On start a node restores any original limits a previous run saved (after a crash) before the
app serves; on shutdown (SIGTERM, SIGINT) it restores every GPU it changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from agents.armed import ArmedController
from agents.backend import GpuBackend
from agents.bearer import bearer
from agents.errors import AgentError, NodeNotFoundError
from agents.fastroutes import fast_router
from agents.fasttrigger import TriggerGuard
from agents.features import DramActivitySource, FeatureSampler
from agents.logs import decision
from agents.metrics import prometheus_text
from agents.podresources import PodGpuReader
from agents.protocol import (
    CapCommand,
    CapResponse,
    GpuInfo,
    GpusResponse,
    Health,
    RestoreResponse,
    SensorInfo,
    TelemetryResponse,
    TelemetrySummary,
    problems,
    validation_detail,
)
from agents.state import OriginalLimits
from agents.telemetry import Sampler


class AgentNode:
    def __init__(
        self,
        node_id: str,
        backend: GpuBackend,
        state_dir: Path,
        *,
        jobs: dict[str, list[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sample_hz: float = 20.0,
        window_s: float = 60.0,
        pods: PodGpuReader | None = None,
        dram: DramActivitySource | None = None,
        feature_period_s: float = 5.0,
        feature_samples: int = 120,
        sensor_lag_s: float | None = None,
    ) -> None:
        self.node_id = node_id
        #: what the agent runs on, for /health (set by `agents.run` from its settings)
        self.configuration: dict[str, Any] | None = None
        self.pods = pods  #: the pods' GPUs (Kubernetes), None where there is no kubelet
        self.backend = backend
        self.controller = ArmedController(
            backend, OriginalLimits(state_dir), clock, node_id=node_id
        )
        # sample_hz = 0: no sampling thread (many simulated nodes in one process).
        self.sampler = Sampler(
            backend,
            jobs or {},
            sample_hz=sample_hz or 10.0,
            window_s=window_s,
            clock=clock,
            sensor_lag_s=sensor_lag_s,
        )
        self.sampling = bool(sample_hz)
        # DRAM activity from `dram` (DCGM), else from the backend where it has it (simulated).
        if dram is None and isinstance(backend, DramActivitySource):
            dram = backend
        self.features = FeatureSampler(
            backend,
            jobs or {},
            dram,
            capped=lambda: {index for index, _ in self.controller.originals.saved().values()},
            period_s=feature_period_s,
            samples=feature_samples,
        )

    def start(self) -> None:
        # A previous run's originals (it was killed) come back before anything is served.
        self.controller.restore_all(reason="restored at start (the last run left caps)")
        if self.sampling:
            self.sampler.start()
            self.features.start()

    def stop(self) -> None:
        restored = self.controller.restore_all(reason="stopping")
        if not restored:
            decision(logging.INFO, "stopping", node=self.node_id, restored_gpus=[])
        self.sampler.stop()
        self.features.stop()
        self.backend.close()
        if self.pods is not None:
            self.pods.close()

    def gpus(self) -> GpusResponse:
        out = []
        for index in range(self.backend.count()):
            uuid, name = self.backend.identity(index)
            limits = self.backend.constraints(index)
            try:
                power: float | None = self.backend.power_w(index)
            except AgentError:
                power = None
            out.append(
                GpuInfo(
                    index=index,
                    uuid=uuid,
                    name=name,
                    min_limit_w=limits.min_w,
                    max_limit_w=limits.max_w,
                    default_limit_w=limits.default_w,
                    enforced_limit_w=self.backend.enforced_limit_w(index),
                    power_w=power,
                    power_capped=self.backend.power_capped(index),
                    energy_j=self.backend.energy_j(index),
                    persistence_mode=self.backend.persistence_mode(index),
                    sensor=SensorInfo.of(self.sampler.sensor),
                )
            )
        return GpusResponse(gpus=out)

    def health(self) -> Health:
        return Health(
            status="ok",
            backend=self.backend.kind,
            node_id=self.node_id,
            gpus=self.backend.count(),
            generation=self.controller.generation,
            lease_remaining_s=self.controller.lease_remaining_s(),
            configuration=self.configuration,
            sensor=SensorInfo.of(self.sampler.sensor),
            can_cap=self.controller.can_cap,
            can_cap_reason=self.controller.can_cap_reason,
        )

    def apply(self, command: CapCommand) -> CapResponse:
        """The node's whole desired state, applied now (blocks on NVML)."""
        return self.controller.apply(command, self.controller.clock())

    def telemetry(self) -> TelemetryResponse:
        pods, pods_error = self.pods.read() if self.pods is not None else (None, None)
        return TelemetryResponse(
            node_id=self.node_id,
            gpus=self.sampler.gpu_power(),
            jobs=self.features.apply(self.sampler.job_telemetry()),
            actuation_delay=self.controller.delay_stats(),
            agent_time_s=self.controller.clock(),
            pods=pods,
            pods_error=pods_error,
            features_error=self.features.error,
            can_cap=self.controller.can_cap,
            can_cap_reason=self.controller.can_cap_reason,
        )

    def summary(self, period_s: float) -> TelemetrySummary:
        """The telemetry published over NATS: each GPU's mean power over the last `period_s`
        (its power now when the node does not sample), the jobs, the delays."""
        if self.sampling:
            last = max(round(period_s / self.sampler.interval_s), 1)
            power = [
                sum(g.power_w) / len(g.power_w) if g.power_w else None
                for g in self.sampler.gpu_power(last)
            ]
        else:
            power = [self._power_now(index) for index in range(self.backend.count())]
        return TelemetrySummary(
            node_id=self.node_id,
            period_s=period_s,
            gpu_power_w=power,
            jobs=self.features.apply(self.sampler.job_telemetry()) if self.sampling else [],
            actuation_delay=self.controller.delay_stats(),
            generation=self.controller.generation,
            lease_remaining_s=self.controller.lease_remaining_s(),
            agent_time_s=self.controller.clock(),
        )

    def _power_now(self, index: int) -> float | None:
        try:
            return self.backend.power_w(index)
        except AgentError:
            return None

    def metrics(self) -> str:
        return prometheus_text(self.node_id, self.backend, self.controller, self.sampler)


class Link(Protocol):
    """Another way in to the nodes, started with the app and stopped before it (NATS)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def node_router(resolve: Callable[..., Any], token: str, prefix: str = "") -> APIRouter:
    """The agent's routes under `prefix`; `resolve` is the dependency that finds the node."""

    router = APIRouter(prefix=prefix, responses=problems(404, 422) if prefix else None)
    auth = [Depends(bearer(token))]
    here = Depends(resolve)  # a default, not an annotation: resolved when the route is made

    @router.get("/health", response_model=Health)
    def health(node: AgentNode = here) -> Health:
        return node.health()

    @router.get("/v1/gpus", response_model=GpusResponse)
    def gpus(node: AgentNode = here) -> GpusResponse:
        return node.gpus()

    @router.put(
        "/v1/caps",
        response_model=CapResponse,
        dependencies=auth,
        responses=problems(400, 401, 409, 422, 502),
    )
    async def put_caps(command: CapCommand, node: AgentNode = here) -> CapResponse:
        received = node.controller.clock()
        if node.backend.kind == "sim":  # microseconds: no thread hop
            return node.controller.apply(command, received)
        return await run_in_threadpool(node.controller.apply, command, received)  # NVML blocks

    @router.delete(
        "/v1/caps", response_model=RestoreResponse, dependencies=auth, responses=problems(401, 502)
    )
    def delete_caps(node: AgentNode = here) -> RestoreResponse:
        return RestoreResponse(results=node.controller.restore_all(reason="restore requested"))

    @router.get("/v1/telemetry", response_model=TelemetryResponse)
    def telemetry(node: AgentNode = here) -> TelemetryResponse:
        return node.telemetry()

    @router.get("/metrics", response_class=PlainTextResponse)
    def metrics(node: AgentNode = here) -> str:
        return node.metrics()

    return router


def create_app(
    nodes: list[AgentNode],
    token: str,
    *,
    prefixed: bool = False,
    lease_check_s: float = 0.1,
    links: Sequence[Link] = (),
    fast: TriggerGuard | None = None,
) -> FastAPI:
    """An app serving `nodes`: one at the root, or each under `/nodes/{node_id}`.

    One watcher thread checks every node's lease each `lease_check_s` seconds. `links` (NATS)
    start once the nodes have restored what a previous run left, and stop before they restore.
    `fast` checks the triggers of the fast path (none: every trigger refused).
    """
    if not prefixed and len(nodes) != 1:
        raise ValueError("serve several nodes with prefixed=True")
    app = FastAPI(
        title="flexgate agent",
        version="0.1.0",
        lifespan=_lifespan(nodes, lease_check_s, links),
        description="Applies power caps on one GPU node, with leases and restore.",
    )
    resolve, prefix = _node_finder(nodes, prefixed)
    app.include_router(node_router(resolve, token, prefix))
    app.include_router(fast_router(resolve, token, fast or TriggerGuard(None, 1.0), prefix))
    _answer_errors(app)
    return app


def _lifespan(
    nodes: list[AgentNode], lease_check_s: float, links: Sequence[Link]
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The nodes started (restoring what a previous run left) with their lease watcher, then
    the links; on the way out the links stopped first, then the watcher and the nodes."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(lease_check_s):
            for node in nodes:
                node.controller.expire()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for node in nodes:
            node.start()
        watcher = threading.Thread(target=watch, name="flexgate-leases", daemon=True)
        watcher.start()
        started: list[Link] = []
        try:
            for link in links:
                await link.start()
                started.append(link)
            yield
        finally:
            for link in started:
                await link.stop()
            stop.set()
            watcher.join(timeout=5.0)
            for node in nodes:
                node.stop()

    return lifespan


def _node_finder(nodes: list[AgentNode], prefixed: bool) -> tuple[Callable[..., Any], str]:
    """The dependency that finds a request's node, and the prefix of the routes it serves."""
    if not prefixed:

        async def only() -> AgentNode:
            return nodes[0]

        return only, ""
    by_id = {node.node_id: node for node in nodes}

    async def find(node_id: str) -> AgentNode:
        node = by_id.get(node_id)
        if node is None:
            raise NodeNotFoundError(f"no node '{node_id}' in this process")
        return node

    return find, "/nodes/{node_id}"


def _answer_errors(app: FastAPI) -> None:
    """Every error as `Problem`: a malformed request's where and what, an agent error's text
    with its status code."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=422)

    @app.exception_handler(AgentError)
    async def agent_error(_: Request, exc: AgentError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)
