"""Starting an agent from its settings: `flexgate agent`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

from agents.backend import GpuBackend
from agents.dcgm import DcgmExporter
from agents.errors import BackendError, NoNvmlError
from agents.logs import decision, show_on_stderr
from agents.podresources import PodGpuReader, PodResourcesClient
from agents.service import AgentNode, create_app
from agents.settings import AgentSettings
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix_json
from flexmodel.jobs import JobMix


def build_node(settings: AgentSettings) -> AgentNode:
    mix = read_mix(settings)
    backend: GpuBackend
    if settings.agent_backend == "nvml":
        backend = open_nvml()
    else:
        backend = SimulatedBackend(settings.agent_gpus, mix=mix, node_id=settings.agent_node_id)
    node = AgentNode(
        settings.agent_node_id,
        backend,
        settings.agent_state_dir / settings.agent_node_id,
        jobs=jobs_on_node(mix, settings.agent_node_id, backend.count()),
        sample_hz=settings.agent_sample_hz,
        window_s=settings.agent_telemetry_window_s,
        pods=pod_reader(settings, backend),
        dram=dram_source(settings, backend),
        feature_period_s=settings.agent_feature_period_s,
        feature_samples=settings.agent_feature_samples,
        sensor_lag_s=settings.agent_sensor_lag_s,
    )
    node.configuration = configuration(settings)
    return node


def configuration(settings: AgentSettings) -> dict[str, Any]:
    """What the agent runs on, as its /health carries it (no secrets)."""
    return {
        "backend": settings.agent_backend,
        "lab": settings.lab,
        "transport": settings.agent_transport,
        "tls": settings.agent_tls_cert is not None,
        "state_dir": str(settings.agent_state_dir),
        "job_mix": str(settings.agent_job_mix) if settings.agent_job_mix else None,
        "dcgm": settings.agent_dcgm_url is not None,
        "podresources": settings.agent_podresources_socket is not None,
    }


def open_nvml() -> GpuBackend:
    """NVML's GPUs, or `NoNvmlError` saying why there are none (one line at the CLI)."""
    try:
        from agents.nvml import NvmlBackend  # loads pynvml only on a GPU node

        backend = NvmlBackend()
    except (ImportError, BackendError) as exc:
        raise NoNvmlError(f"--backend nvml: NVML is not usable here ({exc})") from exc
    if backend.count() == 0:
        raise NoNvmlError("--backend nvml: NVML sees no GPU on this node")
    return backend


def dram_source(settings: AgentSettings, backend: GpuBackend) -> DcgmExporter | None:
    """DCGM-exporter, where `FLEXGATE_AGENT_DCGM_URL` names it (the simulated GPUs read their
    own DRAM activity without it)."""
    if settings.agent_dcgm_url is None:
        return None
    uuids = [backend.identity(i)[0] for i in range(backend.count())]
    return DcgmExporter(settings.agent_dcgm_url, uuids, timeout_s=settings.agent_dcgm_timeout_s)


def pod_reader(settings: AgentSettings, backend: GpuBackend) -> PodGpuReader | None:
    """The pods' GPUs from the kubelet, when its PodResources socket is configured."""
    if settings.agent_podresources_socket is None:
        return None
    uuids = {backend.identity(i)[0]: i for i in range(backend.count())}
    return PodGpuReader(PodResourcesClient(str(settings.agent_podresources_socket)), uuids)


def read_mix(settings: AgentSettings) -> JobMix | None:
    if settings.agent_job_mix is None:
        return None
    path = settings.agent_job_mix
    return parse_job_mix_json(path.read_text(encoding="utf-8"), source=str(path))


def jobs_on_node(mix: JobMix | None, node_id: str, gpus: int) -> dict[str, list[int]]:
    """GPU indices of each job the mix places on this node (all GPUs: one `default` job)."""
    placed = {
        job.id: list(where.gpus)
        for job in (mix.jobs if mix else ())
        for where in job.placement or ()
        if where.node == node_id
    }
    return placed or {"default": list(range(gpus))}


def run_agent(settings: AgentSettings) -> None:
    """Serve until SIGTERM or SIGINT; uvicorn's shutdown runs the node's restore."""
    show_on_stderr()
    node = build_node(settings)
    token = settings.agent_token.get_secret_value()
    links = []
    guard = settings.fast_guard()
    if settings.agent_transport == "nats":
        from agents.natsconnect import check
        from agents.natslink import NatsLink  # nats-py loads only when NATS is chosen

        asyncio.run(check(settings.nats_options()))  # wrong credentials: one line, exit 1

        links.append(
            NatsLink(
                [node],
                settings.nats_options(),
                token,
                telemetry_period_s=settings.agent_telemetry_period_s,
                fast=guard,
            )
        )
    app = create_app(
        [node], token, lease_check_s=settings.agent_lease_check_s, links=links, fast=guard
    )
    decision(
        logging.INFO,
        "agent starting",
        node=node.node_id,
        backend=node.backend.kind,
        gpus=node.backend.count(),
        host=settings.agent_host,
        port=settings.agent_port,
        transport=settings.agent_transport,
        tls=settings.agent_tls_cert is not None,
        job_mix=settings.agent_job_mix,
        jobs=sorted(node.sampler.jobs),
    )
    uvicorn.run(
        app,
        host=settings.agent_host,
        port=settings.agent_port,
        log_level="warning",
        ssl_certfile=str(settings.agent_tls_cert) if settings.agent_tls_cert else None,
        ssl_keyfile=str(settings.agent_tls_key) if settings.agent_tls_key else None,
    )
