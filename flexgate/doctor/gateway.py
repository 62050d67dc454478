"""The gateway's checks, with its settings as `flexgate gateway` reads them: its store, its
agents, its meter, its VTN, NATS and the job source (docs/cli.md, "doctor").

Read-only: the store is opened read-only where it is a file and only its schema version is
read; an agent's token is tried on `PUT /v1/caps` with a body no agent accepts (the agent
checks the token first: 401 for a wrong one, 422 for the body with the right one); over NATS
the agents are asked their health, and the desired-state bucket is neither made nor fitted.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, select

from agents.protocol import Health
from flexgate.doctor import Check, fail, ok, warn
from flexgate.doctor.node import first_error
from flexgate.doctor.remote import meter_check, vtn_check
from gateway.agentclient import AgentClient, AgentUnreachableError
from gateway.app import agent_client, nats_options, open_job_source
from gateway.clock import SystemClock
from gateway.settings import GatewaySettings
from gateway.store.db import UPGRADES
from gateway.store.models import SCHEMA_VERSION, SchemaVersion

#: What the token probe sends: no agent takes it as a command, so nothing can change.
NOT_A_COMMAND = {"doctor": "a token check; this body is invalid on purpose"}


def gateway_settings(overrides: dict[str, Any]) -> tuple[GatewaySettings | None, Check]:
    """The gateway's settings and their own validation, as a check."""
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as exc:
        return None, fail("gateway settings", first_error(exc))
    agents = len(settings.agent_urls)
    said = f"{agents} agents over {settings.transport}, store {shown_url(settings.database_url)}"
    if not agents:
        return settings, warn(
            "gateway settings", f"{said}: FLEXGATE_AGENTS is empty (no GPU is capped)"
        )
    return settings, ok("gateway settings", said)


async def gateway_checks(settings: GatewaySettings) -> list[Check]:
    checks = [store_check(settings.database_url)]
    checks += await agent_checks(settings)
    checks.append(await meter_check(settings))
    checks.append(await vtn_check(settings))
    if settings.transport == "nats":
        checks.append(await nats_check(settings))
    if settings.job_source != "static":
        checks.append(await job_source_check(settings))
    return checks


def shown_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return "(not a database URL)"


def store_check(url: str) -> Check:
    """The store answers and holds this gateway's schema version (read, never written)."""
    name, shown = "store", shown_url(url)
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.is_file():
            return warn(name, f"{shown} does not exist yet: the gateway makes it at start")
        engine = create_engine(
            "sqlite://", creator=lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        )
    else:  # an unroutable host must not hold the doctor for the OS's TCP timeout
        timeout = {"connect_timeout": 5} if url.startswith("postgresql") else {}
        engine = create_engine(url, pool_pre_ping=True, connect_args=timeout)
    try:
        with Session(engine) as session:
            row = session.exec(select(SchemaVersion)).first()
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        if "schema_version" in reason:
            return warn(name, f"{shown} answers but holds no flexgate schema yet")
        return fail(name, f"{shown} unreachable: {reason}")
    finally:
        engine.dispose()
    held = None if row is None else row.version
    if held == SCHEMA_VERSION:
        return ok(name, f"{shown}, schema version {held} (current)", schema_version=held)
    if held is None:
        return warn(name, f"{shown} answers but holds no schema version yet")
    if min(UPGRADES) - 1 <= held < SCHEMA_VERSION:
        return warn(
            name,
            f"{shown}, schema version {held}: the gateway upgrades it to {SCHEMA_VERSION} at start",
            schema_version=held,
        )
    return fail(
        name,
        f"{shown}, schema version {held}: this gateway uses {SCHEMA_VERSION} and refuses it",
        schema_version=held,
    )


async def agent_checks(settings: GatewaySettings) -> list[Check]:
    """Each configured agent: it answers, takes the gateway's token, and may set limits."""
    addresses = settings.agent_urls
    if not addresses:
        return []
    try:
        client = await agent_client(settings, SystemClock(), (), read_only=True)
    except Exception as exc:  # NATS refused the connection: every agent is out of reach
        return [fail("agents", f"no transport to the agents: {exc}")]
    verify: Any = str(settings.agents_ca) if settings.agents_ca else True
    try:
        async with httpx.AsyncClient(timeout=settings.dispatch_timeout_s, verify=verify) as http:
            return list(
                await asyncio.gather(*(_agent(client, http, settings, a) for a in addresses))
            )
    finally:
        await client.close()


async def _agent(
    client: AgentClient, http: httpx.AsyncClient, settings: GatewaySettings, address: str
) -> Check:
    try:
        health = await client.health(address)
    except AgentUnreachableError as exc:
        return fail(f"agent {address}", f"does not answer: {exc}", address=address)
    name = f"agent {health.node_id}"
    figures = {"address": address, "backend": health.backend, "can_cap": health.can_cap}
    if settings.transport == "http":
        refused = await _token_refused(http, address, settings.token_for(health.node_id))
        if refused:
            return fail(name, f"{address} {refused}", **figures)
    said = f"{address}, {health.gpus} GPUs on {health.backend}"
    return _can_cap(name, said, health, settings, figures)


async def _token_refused(http: httpx.AsyncClient, address: str, token: str) -> str | None:
    """Why the agent refuses the gateway's token, or None when it takes it."""
    try:
        answer = await http.put(
            f"{address}/v1/caps",
            json=NOT_A_COMMAND,
            headers={"Authorization": f"Bearer {token}"},
        )
    except httpx.HTTPError as exc:
        return f"did not answer the token check: {type(exc).__name__}"
    if answer.status_code == 401:
        return (
            "refuses the gateway's token (FLEXGATE_AGENT_TOKEN, or the node's own from "
            "FLEXGATE_NODE_TOKEN_SECRET, must be the agent's)"
        )
    if answer.status_code != 422:
        return f"answered the token check with HTTP {answer.status_code}"
    return None


def _can_cap(
    name: str, said: str, health: Health, settings: GatewaySettings, figures: dict[str, Any]
) -> Check:
    if health.backend == "sim" and not (settings.lab or settings.allow_simulated):
        return fail(name, f"{said}: simulated GPUs, which plans refuse outside the lab", **figures)
    if health.can_cap is False:
        why = health.can_cap_reason or "NVML refused a limit"
        return fail(name, f"{said}; may not set limits: {why}", **figures)
    if health.can_cap is None:
        return warn(
            name,
            f"{said}, token taken; whether it may set limits shows at its first cap "
            "(flexgate doctor --node on it judges its permission)",
            **figures,
        )
    return ok(name, f"{said}, token taken, has set limits", **figures)


async def nats_check(settings: GatewaySettings) -> Check:
    from gateway.agentclient.natsbus import NatsConnectError, check

    try:
        await check(nats_options(settings))
    except NatsConnectError as exc:
        return fail("nats", str(exc))
    return ok("nats", f"{settings.nats_url} takes the gateway's credentials")


async def job_source_check(settings: GatewaySettings) -> Check:
    """One read of the job source (squeue, or the Kubernetes API's pod list)."""
    name = f"job source {settings.job_source}"

    async def no_pod_gpus() -> dict[tuple[str, str, str], tuple[int, ...]]:
        return {}  # the agents' kubelets are not asked: the list of pods is what is checked

    class _NoFleet:
        pod_gpus = staticmethod(no_pod_gpus)

    try:
        source = open_job_source(settings, _NoFleet())  # type: ignore[arg-type]
        assert source is not None
        try:
            reading = await source.read()
        finally:
            await source.close()
    except Exception as exc:  # each source has its own errors; the doctor says which
        return fail(name, f"cannot be read: {type(exc).__name__}: {exc}")
    jobs, problems = len(reading.jobs), len(reading.problems)
    return ok(name, f"answers: {jobs} jobs, {problems} refused", jobs=jobs, problems=problems)
