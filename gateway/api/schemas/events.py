"""Events: the body that creates one, and an event as shown with its delivery and ramp."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gateway.api.schemas import OpenAnswer, StrictBody


class EventCreate(StrictBody):
    reduction_kw: float = Field(gt=0, le=1e7, description="facility-level reduction [kW]")
    start: datetime = Field(description="when the target must hold (ISO 8601 with a time zone)")
    duration_s: float = Field(gt=0, le=7 * 86400)
    force: bool = Field(
        default=False,
        description="store it even when it asks more than FLEXGATE_EVENT_MAX_OVERREACH times "
        "what the site can shed now",
    )

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {"reduction_kw": 25.0, "start": "2026-11-29T17:00:00Z", "duration_s": 3600}
            ]
        },
    )


class Interval(BaseModel):
    start: str
    end: str
    reduction_kw: float
    plan_id: str | None


class LimitCompliance(BaseModel):
    limit_kw: float = Field(description="the import capacity limit [kW]")
    intervals: int | None = Field(description="averaging intervals judged after the ramp")
    above: int | None = Field(description="of which averaged above the limit")
    worst_kw: float | None = Field(description="the highest interval mean [kW]")
    met: bool = Field(description="no interval above the limit")


class Delivery(BaseModel):
    meter_source: str = Field(description="the meter read (or estimate)")
    requested_kw: float = Field(description="the reduction asked for, averaged [kW]")
    delivered_kw: float = Field(description="the reduction seen at the meter, averaged [kW]")
    delivered_kwh: float = Field(description="the energy shed at the meter [kWh]")
    measured_s: float = Field(description="how long the meter was read during the event [s]")
    samples: int
    first_at: str
    last_at: str
    limit: LimitCompliance | None = Field(
        default=None, description="a ceiling's averaging intervals against its limit"
    )


class Ramp(BaseModel):
    down_kw_per_min: float | None = Field(description="the limit on the power falling")
    up_kw_per_min: float | None = Field(description="the limit on the power rising")
    plans: int = Field(description="the event's plans (its shed and its caps stepping back)")
    limited_plans: int = Field(description="of which the limit held back from the target")
    steepest_down_kw_per_min: float = Field(description="the largest planned fall in a minute")
    steepest_up_kw_per_min: float = Field(description="the largest planned rise in a minute")


class SettlementLink(BaseModel):
    href: str = Field(description="GET it for the event settled under each rule")
    rules: list[str] = Field(description="the program's baseline presets")
    interval_min: int = Field(description="the settlement interval [min]")
    timezone: str = Field(description="the site's clock (IANA)")


class Event(OpenAnswer):
    id: str
    source: str = Field(description="manual, openadr, or fast (docs/fast.md)")
    status: str = Field(
        description="pending, active, completed, cancelled, opted_out, failed; a fast event: "
        "triggered while it lasts, then completed"
    )
    start: str
    end: str
    reduction_kw: float = Field(description="the current interval's facility-level target [kW]")
    intervals: list[Interval]
    opt: str = Field(description="in or out")
    reason: str | None
    plan_id: str | None
    feasible: bool | None
    delivery: Delivery | None = Field(
        default=None,
        description="what the event shed at the meter while the site loop pursued it; null "
        "before its first sample, or with the loop off",
    )
    ramp: Ramp | None = Field(
        default=None,
        description="its plans against the ramp-rate limit; null with no limit set (or for an "
        "event planned before this gateway started)",
    )
    settlement: SettlementLink | None = Field(
        default=None, description="where its settlement under the program's baselines is"
    )


class Events(BaseModel):
    events: list[Event]
