"""`GET /health`: how the gateway and what it depends on stand."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.schemas import OpenAnswer


class Health(OpenAnswer):
    status: str
    store: str
    scheduler: bool
    agents_configured: int
    agents_known: int
    ven: str | None
    job_source: dict[str, Any] | None = Field(
        default=None, description="the scheduler the jobs follow; null for the static mix"
    )
    backends: dict[str, int] = Field(
        default_factory=dict, description="known nodes per GPU backend (`nvml`, `sim`)"
    )
    configuration: dict[str, Any] | None = Field(
        default=None,
        description="what the gateway runs on: store, meter, transport, job source, OpenADR "
        "(docs/operations.md), secrets masked",
    )
