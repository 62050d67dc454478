"""Starting the gateway from its settings: `flexgate gateway`."""

from __future__ import annotations

import asyncio
import gc

import uvicorn

from gateway.app import create_app, nats_options
from gateway.settings import GatewaySettings


def run_gateway(settings: GatewaySettings) -> None:
    """Serve until SIGTERM or SIGINT; TLS when a certificate and key are set. Over NATS, wrong
    credentials stop it here, with the broker's reason (one line, exit 1)."""
    if settings.transport == "nats":
        from gateway.agentclient.natsbus import check

        asyncio.run(check(nats_options(settings)))
    app = create_app(settings)
    # What is loaded by now (the modules, the app, their schemas) lives as long as the process:
    # out of the cyclic collector's sight, a full collection scans what the gateway made since,
    # not all of it (under load, a full scan every few seconds held the event loop 150 ms).
    gc.freeze()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
    )
