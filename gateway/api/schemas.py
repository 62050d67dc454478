"""Request bodies of the gateway API (responses are documented in CONTRACT.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class JobsBody(_Strict):
    """The whole job mix (site settings such as the overhead factor are not part of it)."""

    jobs: list[dict[str, Any]]

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "jobs": [
                        {
                            "id": "qwen3-32b-pt",
                            "gpus": 16,
                            "power_w": 640.0,
                            "throughput": 42000.0,
                            "pfi": 1.47,
                            "min_throughput_fraction": 0.5,
                            "period_s": 2.4,
                            "duty": 0.7,
                            "placement": [
                                {"node": "node-01", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
                                {"node": "node-02", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
                            ],
                        }
                    ]
                }
            ]
        },
    )


class EventCreate(_Strict):
    reduction_kw: float = Field(gt=0, description="facility-level reduction [kW]")
    start: datetime = Field(description="when the target must hold (ISO 8601 with a time zone)")
    duration_s: float = Field(gt=0, le=7 * 86400)

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {"reduction_kw": 25.0, "start": "2026-11-29T17:00:00Z", "duration_s": 3600}
            ]
        },
    )


class QuoteRequest(_Strict):
    reduction_kw: float | None = Field(default=None, ge=0)
    window_s: float = Field(default=3600.0, gt=0)
    confidence: float = Field(default=0.9, gt=0, lt=1)

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [{"reduction_kw": 100.0, "window_s": 3600, "confidence": 0.9}]
        },
    )
