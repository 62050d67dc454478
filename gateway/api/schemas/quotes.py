"""A quote: what the site can promise over a window."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, ConfigDict, Field, field_validator

from flexmodel.baselines import RULE_NAMES, is_preset
from gateway.api.schemas import OpenAnswer, StrictBody


class QuoteRequest(StrictBody):
    reduction_kw: float | None = Field(default=None, ge=0)
    window_s: float = Field(default=3600.0, gt=0)
    confidence: float = Field(default=0.9, gt=0, lt=1)
    #: a baseline preset: the answer adds what the utility would count (`counted`)
    baseline: str | None = None
    #: when the window begins (ISO 8601 with its offset; default now)
    start: AwareDatetime | None = None

    @field_validator("baseline")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and not is_preset(name):
            raise ValueError(f"baseline {name!r} is not a preset (one of {RULE_NAMES})")
        return name

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [{"reduction_kw": 100.0, "window_s": 3600, "confidence": 0.9}]
        },
    )


class Quote(OpenAnswer):
    window_s: float
    overhead_factor: float
    confidence: float
    achievable_kw: float
    firm_kw: float
    supply_curve: list[dict[str, float]]
    jobs: list[dict[str, Any]]
    counted: dict[str, Any] | None = Field(
        default=None, description="with `baseline`: what the utility would count"
    )
