"""`GET /v1/predictor`: the PFI predictor in force."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.schemas import OpenAnswer


class Predictor(OpenAnswer):
    """`GET /v1/predictor`."""

    feature: str
    in_use: bool
    reason: str | None = Field(description="why jobs keep the default, when they do")
    fit: dict[str, Any] = Field(description="the predictor in force")
    study: dict[str, Any] = Field(description="the study's fit it starts from")
    site_records: int
    site_records_needed: int
    records: list[dict[str, Any]]
    predicted_jobs: list[str]
