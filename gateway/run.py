"""Starting the gateway from its settings: `flexgate gateway`."""

from __future__ import annotations

import asyncio

import uvicorn

from gateway.app import create_app, nats_options
from gateway.settings import GatewaySettings


def run_gateway(settings: GatewaySettings) -> None:
    """Serve until SIGTERM or SIGINT; TLS when a certificate and key are set. Over NATS, wrong
    credentials stop it here, with the broker's reason (one line, exit 1)."""
    if settings.transport == "nats":
        from gateway.agentclient.natsbus import check

        asyncio.run(check(nats_options(settings)))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
    )
