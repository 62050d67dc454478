"""Starting the gateway from its settings: `flexgate gateway`."""

from __future__ import annotations

import asyncio
import gc
import sys

import uvicorn

from gateway.app import create_app, nats_options
from gateway.services.configuration import configuration_lines, effective_configuration
from gateway.settings import GatewaySettings

#: The cyclic collector's thresholds once the gateway has started (`tune_collector`).
COLLECTOR_THRESHOLDS = (10_000, 10, 1000)


def tune_collector() -> None:
    """Set the cyclic garbage collector for a long-running gateway; call once it has started.

    What is loaded by now (the modules, the app, their schemas) lives as long as the process:
    out of the collector's sight, a full collection scans what the gateway made since, not all
    of it (under load, a full scan every few seconds held the event loop 150 ms; in a process
    on a loaded machine, 2 to 5 s, as long as a short lease). What it makes since is
    long-lived too, and almost never cyclic: every 10,000-node event leaves some 500,000
    objects (answers, plan, caps), and the default thresholds then ran a full collection every
    second or two, 250-750 ms each, 1.3 s of a 3.3 s event start, finding nothing to free.
    Young collections stay frequent; a full one waits for 1,000 of the middle ones, i.e. 100
    million objects made (docs/benchmarks.md, "The collector")."""
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


def run_gateway(settings: GatewaySettings) -> None:
    """Serve until SIGTERM or SIGINT; TLS when a certificate and key are set. Over NATS, wrong
    credentials stop it here, with the broker's reason (one line, exit 1)."""
    if settings.transport == "nats":
        from gateway.agentclient.natsbus import check

        asyncio.run(check(nats_options(settings)))
    # What it runs on, before anything else: a default taken in silence misleads an operator.
    for line in configuration_lines(effective_configuration(settings)):
        print(f"flexgate gateway: {line}", file=sys.stderr, flush=True)
    app = create_app(settings)
    tune_collector()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
    )
