"""The gateway's effective configuration: what it runs on, as an operator must see it.

Printed at start (`flexgate gateway`) and carried by `/health`, so that a default taken in
silence (SQLite for PostgreSQL, the estimate for a meter, simulated GPUs for real ones) shows
where an operator looks. Secrets never appear: passwords in URLs become `***`, tokens are
only said to be set or not.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from gateway.meter.sources import redacted
from gateway.settings import GatewaySettings


def store_doc(database_url: str) -> dict[str, str]:
    """The store's dialect (`sqlite`, `postgresql` ...) and where it is, password masked."""
    parts = urlsplit(database_url)
    dialect = parts.scheme.partition("+")[0] or "unknown"
    if dialect == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db: the path after the third slash.
        location = database_url.partition(":///")[2] or ":memory:"
    else:
        # The query goes too: drivers take passwords there as well (?password=...).
        location = redacted(parts._replace(query=""))
    return {"dialect": dialect, "location": location}


def effective_configuration(settings: GatewaySettings) -> dict[str, Any]:
    """What the gateway runs on (docs/operations.md, "Running it"), for `/health`."""
    vtn = None
    if settings.vtn_url:
        vtn = {"version": settings.openadr, "url": redacted(urlsplit(settings.vtn_url))}
    return {
        "lab": settings.lab,
        "store": store_doc(settings.database_url),
        "meter": (
            {"source": redacted(urlsplit(settings.meter_url)), "estimated": False}
            if settings.meter_url
            else {"source": "estimate", "estimated": True}
        ),
        "transport": {
            "kind": settings.transport,
            "agents_configured": len(settings.agent_urls),
            "agent_tokens": "per node" if settings.node_token_secret is not None else "shared",
            "agents_ca": str(settings.agents_ca) if settings.agents_ca else None,
            **(
                {"nats_url": redacted(urlsplit(settings.nats_url))}
                if settings.transport == "nats"
                else {}
            ),
        },
        "job_source": settings.job_source,
        "openadr": vtn,
        "tls": settings.tls_cert is not None,
        "reads": (
            "token"
            if settings.read_token is not None and settings.read_token.get_secret_value()
            else "open"
        ),
        "simulated_gpus": "allowed" if settings.lab or settings.allow_simulated else "refused",
    }


def configuration_lines(config: dict[str, Any]) -> list[str]:
    """The start-up print: one `name: value` line per part, as docs/operations.md shows."""
    store, meter, transport, vtn = (
        config["store"],
        config["meter"],
        config["transport"],
        config["openadr"],
    )
    return [
        f"store: {store['dialect']} at {store['location']}",
        "meter: "
        + (
            "none, facility power is estimated from the agents"
            if meter["estimated"]
            else meter["source"]
        ),
        f"transport: {transport['kind']} to {transport['agents_configured']} configured agent(s)"
        + (f" via {transport['nats_url']}" if "nats_url" in transport else "")
        + f", {transport['agent_tokens']} agent token(s)"
        + (f", agents verified against {transport['agents_ca']}" if transport["agents_ca"] else ""),
        f"job source: {config['job_source']}",
        "openadr: " + (f"{vtn['version']} VTN {vtn['url']}" if vtn else "none (manual events)"),
        f"tls: {'on' if config['tls'] else 'off'}; reads: {config['reads']}",
        f"simulated GPUs: {config['simulated_gpus']}" + (" (lab)" if config["lab"] else ""),
    ]
