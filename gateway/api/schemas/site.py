"""The site's answers: its power, the nodes, the phases' sync and the meter history."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from gateway.api.schemas import OpenAnswer


class SiteState(OpenAnswer):
    gpu_power_kw: float
    facility_power_kw: float
    baseline_gpu_kw: float
    baseline_facility_kw: float
    shed_facility_kw: float
    overhead_factor: float
    active_event_id: str | None


class SyncState(BaseModel):
    jobs: list[dict[str, Any]]
    order_parameters: dict[str, float] | None = Field(
        description="r1..r3 over the jobs whose phase the agents can resolve"
    )
    alarms: dict[str, Any] = Field(
        description="Rayleigh alarm held for three windows, per harmonic; below 8 jobs, each "
        "pair's phase-locking value"
    )
    clocks: dict[str, dict[str, float | None] | None] = Field(
        default_factory=dict,
        description="each agent's clock offset from the gateway's, and its bound [s] (null "
        "over NATS: a published summary's one-way stamp leaves the error unbounded)",
    )
    loops: list[dict[str, Any]]
    verdict: str
    scattering: dict[str, Any] = Field(
        description="phase scattering: `mode` (auto or off), `active`, the `episode` under way "
        "(reason, start, rate spread, throughput cost) and the last `ended` ones"
    )
    oscillation: dict[str, Any] | None = Field(
        default=None,
        description="the site power's oscillation: per source (`meter`, `agents`) the swing at "
        "the fleet's dominant periods and the RMS within the band as far as the source sees "
        "it (null with the `reason` where it cannot), the `limit_kw` and the `alarm`",
    )


class MeterIntervalDoc(OpenAnswer):
    start: str
    end: str
    mean_kw: float | None = Field(description="the mean of its samples [kW]; null in a gap")
    samples: int
    coverage: float = Field(description="samples over those the meter period gives it, 0 to 1")
    gap: bool = Field(description="more than one sample missing (none at all: coverage 0)")
    estimated_share: float
    estimated: bool = Field(description="any sample estimated, or taken while the meter faulted")
    fault: bool = Field(description="any sample taken while the meter was faulted or suspected")


class MeterSampleDoc(OpenAnswer):
    at: str
    power_kw: float = Field(description="the meter's reading, or the estimate [kW]")
    estimated: bool
    fault: bool


class MeterHistoryDoc(OpenAnswer):
    """`GET /v1/site/meter`: `intervals` for 1m to 30m, `samples` for raw."""

    interval: str
    interval_s: int | None
    start: str
    end: str
    source: str = Field(description="the meter now, or `estimate`")
    meter_period_s: float
    intervals: list[MeterIntervalDoc] | None = None
    samples: list[MeterSampleDoc] | None = None


class Nodes(OpenAnswer):
    """`GET /v1/nodes`: each node's state as the gateway knows it."""

    nodes: list[dict[str, Any]]
