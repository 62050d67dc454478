"""A plan: the jobs' caps, and the commands sent to each node with its answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from gateway.api.schemas import OpenAnswer


class JobCap(OpenAnswer):
    id: str
    cap_w: float
    power_w: float
    throughput: float
    throughput_fraction: float
    tier: int | None = Field(default=None, description="the job's flexibility tier, if tagged")
    min_throughput_fraction: float = Field(default=0.0, description="its floor, tier in force")
    protected: bool = False


class Cap(BaseModel):
    gpu: int
    cap_w: float


class EnforcedCap(BaseModel):
    gpu: int
    enforced_w: float | None
    clamped: bool


class NodeCommand(BaseModel):
    """The caps sent to one node and its last answer (`pending` until the first)."""

    node: str
    caps: list[Cap]
    status: str = Field(description="pending, acked or failed")
    generation: int | None = None
    attempts: int | None = None
    sent_at: str | None = None
    acked_at: str | None = None
    delay_s: float | None = None
    error: str | None = None
    enforced: list[EnforcedCap] = Field(
        default_factory=list, description="per GPU, the limit the agent read back in its answer"
    )


class Plan(OpenAnswer):
    id: str
    event_id: str | None
    generation: int
    strategy: str
    feasible: bool
    requested_facility_kw: float
    max_facility_kw: float
    shortfall_kw: float
    expected_facility_kw: float
    achieved_facility_kw: float | None = Field(description="measured, for the current plan")
    jobs: list[JobCap]
    commands: list[NodeCommand]
    unplaced_jobs: list[str]
    unreachable_nodes: list[str] = Field(
        default_factory=list, description="nodes planned as down: their jobs give nothing"
    )
    uncappable_nodes: list[dict[str, str]] = Field(
        default_factory=list,
        description="nodes whose agent may not set limits (`can_cap` false on its /health), "
        "each with the reason: their jobs give nothing",
    )
    sync: dict[str, Any]
