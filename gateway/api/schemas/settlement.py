"""An event settled under each of the program's baseline rules."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.schemas import OpenAnswer


class SettledInterval(OpenAnswer):
    start: str
    end: str
    baseline_kw: float | None = Field(description="what the rule counts; null: no baseline")
    unadjusted_baseline_kw: float | None
    metered_kw: float | None = Field(description="the meter history's mean; null: no reading")
    delivered_kw: float | None = Field(description="baseline less metered [kW]")
    delivered_kwh: float | None
    target_kw: float = Field(description="the event's reduction over the interval [kW]")
    met: bool = Field(description="delivered at least the target")
    estimated: bool = Field(description="a sample estimated or faulted in it")
    estimated_share: float
    fault: bool = Field(description="a sample taken while the meter faulted")
    gap: bool = Field(description="the meter history is missing samples in it")
    hours: float


class SettlementTotals(OpenAnswer):
    intervals: int
    intervals_met: int
    compliance: float | None = Field(description="the share of intervals met")
    delivered_kwh: float | None
    target_kwh: float
    mean_delivered_kw: float | None
    mean_target_kw: float | None
    estimated_intervals: list[str]
    fault_intervals: list[str]
    unsettled_intervals: list[str] = Field(description="no baseline or no reading")


class SettlementBaseline(OpenAnswer):
    days_used: list[str] = Field(description="the local days the baseline averages")
    adjustment_factor: float
    adjustment_kw: float
    capped: bool
    adjusted: bool


class SettledRule(OpenAnswer):
    rule: str = Field(description="the preset (flexmodel.baselines.PRESETS)")
    kind: str
    parameters: dict[str, Any]
    reason: str | None = Field(description="why the rule gives no baseline; null when it does")
    baseline: SettlementBaseline | None
    intervals: list[SettledInterval]
    totals: SettlementTotals


class Settlement(OpenAnswer):
    event_id: str
    status: str
    start: str
    end: str
    timezone: str
    interval_min: int
    event_day: str = Field(description="the event's local day")
    holidays: list[str]
    event_days_excluded: list[str] = Field(description="other events' local days")
    throughput_kept: float | None = Field(description="the plan's throughput after over before")
    computed_at: str
    rules: list[SettledRule]
