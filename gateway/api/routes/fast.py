"""`/v1/fast`: the fast path's trigger and its armed plans (docs/fast.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from agents.protocol import problems
from gateway.api.deps import Writer, v1_router
from gateway.services.fast import FastPath
from gateway.services.frequency import FrequencyTrigger

router = v1_router()


async def _fast(request: Request) -> FastPath:
    fast: FastPath = request.app.state.fast
    return fast


FastDep = Annotated[FastPath, Depends(_fast)]


async def _frequency(request: Request) -> FrequencyTrigger:
    frequency: FrequencyTrigger = request.app.state.frequency
    return frequency


FrequencyDep = Annotated[FrequencyTrigger, Depends(_frequency)]


class FastTriggerCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    depth_pct: float = Field(gt=0, le=100, description="an armed depth (FLEXGATE_FAST_DEPTHS) [%]")
    duration_s: float = Field(gt=0, le=3600, description="how long the caps hold [s]")


class FastTriggered(BaseModel):
    event_id: str  #: the fast event in /v1/events (source `fast`)
    seq: int  #: the trigger's sequence number
    depth_pct: float
    duration_s: float
    expected_reduction_kw: float  #: the depth's planned reduction at the facility meter [kW]
    armed_nodes: int  #: nodes holding caps armed at that depth
    renewal: bool = False  #: it renewed the fast event in force (no new event)


class FastArmed(BaseModel):
    enabled: bool
    depths_pct: list[float]
    generation: int  #: of the last plans sent (0: none yet)
    expected_reduction_kw: dict[str, float]  #: per depth [kW]
    armed_nodes: dict[str, int]  #: per depth, the nodes holding caps for it
    nodes_sent: int  #: armed states sent since start (only the nodes whose caps moved)
    last_rearm_at: str | None = None  #: when plans were last sent (ISO UTC; null: never)
    settled: bool  #: every node holds the plans of the mix and fleet in force
    holding: bool  #: a fast event lasts now


class FastTriggerSent(BaseModel):
    seq: int
    event_id: str | None  #: the fast event it started or renewed (null while being sent)
    depth_pct: float
    sent_at: str  #: ISO UTC
    renewal: bool
    reports: int  #: agents' reports so far (one per agent process over NATS, per node else)
    nodes_applied: int  #: nodes whose armed caps were enforced (read back)
    failed_gpus: int  #: GPUs whose cap did not read back
    first_enforced_s: float | None  #: trigger to the first report [s]
    enforced_s: float | None  #: trigger to the last report so far [s]


class FastTriggers(BaseModel):
    triggers: list[FastTriggerSent]  #: the last 100 since start, newest last


@router.post(
    "/fast/trigger",
    response_model=FastTriggered,
    status_code=202,
    responses=problems(400, 401, 409, 422, 503),
)
async def trigger(body: FastTriggerCreate, fast: FastDep, actor: Writer) -> dict[str, Any]:
    return await fast.trigger(body.depth_pct, body.duration_s)


@router.get("/fast/armed", response_model=FastArmed)
async def armed(fast: FastDep) -> dict[str, Any]:
    return fast.doc()


@router.get("/fast/triggers", response_model=FastTriggers)
async def triggers(fast: FastDep) -> dict[str, Any]:
    """The last triggers sent since start, each with its agents' reports: trigger to caps
    enforced, as the `flexgate_fast_trigger_to_enforced_seconds` histogram counts it."""
    return {"triggers": list(fast.triggers)}


class FastFrequency(BaseModel):
    enabled: bool  #: FLEXGATE_FREQUENCY_URL set and the fast path on
    source: str | None  #: the feed's URL
    mode: str | None  #: threshold or droop
    period_s: float
    hz: float | None  #: the last plausible reading [Hz]
    fault: str | None  #: why the last reading could not be acted on (null: it could)
    depth_pct: float  #: the depth the trigger holds now (0: none)
    crossing_at: str | None  #: when the excursion in course crossed
    triggers: int  #: fired since start
    last_event_id: str | None
    delay_s: float  #: the feed path's delay: sample period and trigger path [s]
    measured_trigger_delay_s: float | None  #: mean trigger to caps enforced, reported [s]
    droop: dict[str, Any] | None  #: the droop path's phase report (droop mode)
    droop_refused: str | None


@router.get("/fast/frequency", response_model=FastFrequency)
async def frequency(trigger: FrequencyDep) -> dict[str, Any]:
    return trigger.doc()
