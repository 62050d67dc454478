"""The agent's wire schemas (docs/agents.md, "API summary").

With `agents.protocol_fast`, the only modules of `agents` the gateway imports. Commands refuse
unknown fields; every number must be finite. Units are in the names: watts (`_w`), seconds
(`_s`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The settings' shared rules, which the gateway and the CLI read here.
from agents.protocol_settings import AGENT_NAMESPACE as AGENT_NAMESPACE
from agents.protocol_settings import LAB_TOKEN as LAB_TOKEN
from agents.protocol_settings import MIN_TOKEN_CHARS as MIN_TOKEN_CHARS
from agents.protocol_settings import PLACEHOLDER_TOKENS as PLACEHOLDER_TOKENS
from agents.protocol_settings import node_token as node_token
from agents.protocol_settings import unknown_variables as unknown_variables
from flexmodel.sensors import SensorModel


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GpuCap(_Strict):
    gpu: int = Field(ge=0, description="GPU index on the node")
    cap_w: float = Field(gt=0, description="requested per-GPU power limit [W]")


class CapCommand(_Strict):
    """A node's whole desired state: GPUs not listed go back to their original limit."""

    plan_id: str = Field(min_length=1, max_length=200)
    generation: int = Field(ge=0, description="rises with every new plan; older ones get 409")
    lease_s: float = Field(gt=0, le=86400, description="the caps hold this long unless renewed")
    caps: list[GpuCap] = Field(default_factory=list)

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "plan_id": "plan-42",
                    "generation": 7,
                    "lease_s": 600,
                    "caps": [{"gpu": 0, "cap_w": 450.0}, {"gpu": 1, "cap_w": 450.0}],
                }
            ]
        },
    )


class CapResult(BaseModel):
    gpu: int
    requested_w: float | None  #: None for a GPU restored to its original limit
    enforced_w: float | None  #: what the GPU enforces after the change (read back)
    clamped: bool  #: the request lay outside the GPU's constraints
    elapsed_s: float  #: from the request's arrival to the limit read back
    error: str | None = None


class CapResponse(BaseModel):
    plan_id: str
    generation: int
    lease_s: float
    results: list[CapResult]
    can_cap: bool | None = Field(
        default=None,
        description="whether this agent may set limits, as its last sets showed (see Health); "
        "absent from agents before it was added",
    )
    can_cap_reason: str | None = Field(default=None, description="why it may not")


class RestoreResponse(BaseModel):
    results: list[CapResult]


class SensorInfo(BaseModel):
    """The GPU's power sensor as modelled (`flexmodel.sensors`): the phases the agent reports
    are corrected by its lag."""

    field: str  #: instant, average, or given (FLEXGATE_AGENT_SENSOR_LAG_S)
    update_s: float  #: each reading held this long [s]
    average_s: float  #: each reading the mean over this long [s]
    lag_s: float  #: the effective lag, (update_s + average_s) / 2 [s]

    @classmethod
    def of(cls, sensor: SensorModel) -> SensorInfo:
        return cls(
            field=sensor.field,
            update_s=sensor.update_s,
            average_s=sensor.average_s,
            lag_s=sensor.lag_s,
        )


class GpuInfo(BaseModel):
    index: int
    uuid: str
    name: str
    min_limit_w: float
    max_limit_w: float
    default_limit_w: float
    enforced_limit_w: float
    power_w: float | None
    power_capped: bool | None = None  #: the SW power cap is slowing the clocks now
    energy_j: float | None = None  #: the GPU's energy counter, where it has one
    persistence_mode: bool | None = None  #: without it a driver reload forgets the limits
    sensor: SensorInfo | None = None  #: its power sensor as modelled


class GpusResponse(BaseModel):
    gpus: list[GpuInfo]


class GpuPower(BaseModel):
    index: int
    power_w: list[float]  #: recent samples, oldest first
    sample_interval_s: float
    #: the mean SM clock over those samples [MHz] (NVML_CLOCK_SM); None where not read
    sm_clock_mhz: float | None = None


class CapPoint(BaseModel):
    """A job's point at one cap level the agent saw (`agents.levels`): what a sweep is made of.

    `relative_throughput` is `T_ref / T`, the iteration period at the reference level (the
    highest cap seen, `JobTelemetry.reference_cap_w`) over the period at this one; null, with
    `no_period_reason`, where the power shows no clear period (never an invented one)."""

    cap_w: float  #: the lowest enforced limit of the job's GPUs over the stretch [W]
    power_w: float  #: mean power per GPU over whole periods [W]
    power_stderr_w: float | None = None
    period_s: float | None = None
    period_stderr_s: float | None = None
    period_confidence: float | None = None  #: the autocorrelation at the period (1: alike)
    #: the two power levels per GPU, compute (the cap, where it clips) and communication [W];
    #: null without a period. A cap at or below `comm_w` clips both flat: no period shows.
    compute_w: float | None = None
    comm_w: float | None = None
    #: the mean SM clock over the stretch's whole periods, and over its compute phase (the
    #: samples above the midpoint of the two levels: what a cap slows) with its standard
    #: error [MHz]; None where the GPUs' clocks were not read
    sm_clock_mhz: float | None = None
    compute_sm_clock_mhz: float | None = None
    compute_sm_clock_stderr_mhz: float | None = None
    relative_throughput: float | None = None
    relative_throughput_stderr: float | None = None
    periods: float = 0.0  #: iteration periods the stretch covered
    samples: int = 0
    span_s: float = 0.0  #: the stretch measured [s]
    no_period_reason: str | None = None
    #: when the stretch measured began and ended (the agent's monotonic clock, the time base
    #: of `TelemetryResponse.agent_time_s`) [s]; null from agents before they said
    start_s: float | None = None
    end_s: float | None = None


class JobTelemetry(BaseModel):
    job_id: str
    period_s: float | None
    duty: float | None
    phase_rad: float | None  #: None when the reading is too coarse for the period
    phase_at: float | None  #: agent monotonic time [s] of that phase
    power_w: float | None  #: mean power per GPU over the window
    #: the mean SM clock of the job's GPUs over the window [MHz]; None where not read
    sm_clock_mhz: float | None = None
    period_confidence: float | None = None  #: the autocorrelation at the period (1: alike)
    no_period_reason: str | None = None  #: why `period_s` is null, when a trace was read
    cap_w: float | None = None  #: the lowest enforced limit of the job's GPUs now [W]
    reference_cap_w: float | None = None  #: the level `points` are relative to [W]
    points: list[CapPoint] = Field(default_factory=list)  #: per cap level seen, by cap
    #: every stretch at one cap measured lately, oldest first (several at one cap: a probe's
    #: uncapped references before, between and after its capped levels, from which the
    #: gateway measures the job's drift); `relative_throughput` null in them: their periods
    #: compare directly
    stretches: list[CapPoint] = Field(default_factory=list)
    #: the PFI predictor's features over the job's uncapped run (`agents.features`): memory
    #: copy utilisation and DRAM activity [0-1], their product; None where not read
    mem_copy_util: float | None = None
    dram_active: float | None = None
    dram_copy_product: float | None = None
    feature_samples: int = 0  #: readings per GPU behind the product, summed over its GPUs


class DelayStats(BaseModel):
    p50_s: float | None
    p99_s: float | None
    count: int
    #: the latest delays [s], oldest first (at most `DELAY_SAMPLES`): the distribution the
    #: gateway's sync verdicts average over
    recent_s: list[float] = []


DELAY_SAMPLES = 32


class PodGpus(BaseModel):
    """A Kubernetes pod's GPUs on this node, from the kubelet's PodResources API."""

    namespace: str
    name: str
    gpus: list[int]  #: this node's GPU indices
    unknown_devices: list[str] = Field(
        default_factory=list, description="device ids the pod holds that name no GPU here"
    )


class TelemetryResponse(BaseModel):
    node_id: str
    gpus: list[GpuPower]
    jobs: list[JobTelemetry]
    actuation_delay: DelayStats
    #: the agent's monotonic clock when it answered [s]: the time base of `phase_at`, from
    #: which the gateway estimates this agent's clock offset
    agent_time_s: float | None = None
    pods: list[PodGpus] | None = Field(
        default=None, description="pods' GPUs (PodResources); null when the agent reads none"
    )
    pods_error: str | None = Field(default=None, description="why the kubelet gave no answer")
    features_error: str | None = Field(
        default=None, description="why the last DRAM activity reading (DCGM) failed"
    )
    can_cap: bool | None = Field(default=None, description="as on /health")
    can_cap_reason: str | None = Field(default=None, description="as on /health")


class Health(BaseModel):
    status: str
    backend: str  #: `nvml` (the node's GPUs) or `sim` (simulated GPUs)
    node_id: str
    gpus: int
    generation: int | None
    lease_remaining_s: float | None
    configuration: dict[str, Any] | None = Field(
        default=None,
        description="what the agent runs on (transport, TLS, state folder, job mix; no "
        "secrets); absent from agents before it was added",
    )
    sensor: SensorInfo | None = Field(
        default=None,
        description="its GPUs' power sensor as modelled: the lag of every power figure it "
        "reports (the site loop on the estimate reads it); absent from agents before it was added",
    )
    can_cap: bool | None = Field(
        default=None,
        description="whether the agent may set limits: null until its first set (no NVML call "
        "tells without changing a limit), true once one was accepted, false once NVML refused "
        "one for permission (sticky until the agent restarts)",
    )
    can_cap_reason: str | None = Field(
        default=None, description="why it may not (NVML's refusal), with can_cap false"
    )


def validation_detail(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A request's validation errors for a 422 answer: where and what, never the input itself
    (a NaN there would not even serialise)."""
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]


def validation_status(errors: Sequence[Mapping[str, Any]]) -> int:
    """The status of a refused body: 400 when it is not JSON at all, else 422."""
    return 400 if any(e["type"] == "json_invalid" for e in errors) else 422


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """Every error answer of both services: what was wrong, in words. A malformed request
    (422) lists where and what; a request the model refuses says it in one sentence."""

    detail: str | list[FieldError]


_PROBLEMS = {
    400: "the body is not valid JSON",
    401: "no valid bearer token",
    404: "no such resource",
    409: "the request conflicts with the current state",
    422: "a malformed request, or one the model refuses; nothing was changed",
    502: "the GPU or its driver failed",
    503: "the store is unreachable; nothing was changed (Retry-After)",
}


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error codes, all answered as `Problem`."""
    return {code: {"model": Problem, "description": _PROBLEMS[code]} for code in codes}


# --- over NATS (docs/nats.md) -------------------------------------------------------------------

#: Every subject flexgate uses starts with this.
SUBJECT_ROOT = "flexgate"
#: The JetStream key-value bucket of desired states, one key per node, written by the gateway.
DESIRED_BUCKET = "flexgate_desired"
#: Where agents publish their telemetry summaries (`flexgate.telemetry.<node>`).
TELEMETRY_SUBJECTS = f"{SUBJECT_ROOT}.telemetry.*"
#: What a node id may be over NATS: one subject token, and a key of the desired-state bucket.
NATS_NODE_ID = r"^[A-Za-z0-9_-]{1,128}$"


def caps_subject(node_id: str) -> str:
    """A node's commands, request and reply: the body is a `CapCommand`, the reply a
    `NatsAnswer`."""
    return f"{SUBJECT_ROOT}.caps.{node_id}"


def health_subject(node_id: str) -> str:
    """A node's health, request and reply (any body): the reply is a `NatsAnswer`."""
    return f"{SUBJECT_ROOT}.health.{node_id}"


def telemetry_subject(node_id: str) -> str:
    return f"{SUBJECT_ROOT}.telemetry.{node_id}"


class NatsAnswer(BaseModel):
    """An agent's reply on NATS: the HTTP API's answer and status code, in one message.

    `status` 200 carries `caps` or `health`; any other status carries `detail`, the HTTP API's
    error detail for the same request (401, 409, 422 ...)."""

    status: int
    caps: CapResponse | None = None
    health: Health | None = None
    detail: Any = None


class TelemetrySummary(BaseModel):
    """What an agent publishes every telemetry period: its telemetry without the sample
    trace (each GPU's mean power over the last period, one number)."""

    node_id: str
    period_s: float  #: how often this node publishes [s]
    gpu_power_w: list[float | None]  #: per GPU index, the mean over the last period [W]
    jobs: list[JobTelemetry]
    actuation_delay: DelayStats
    generation: int | None
    lease_remaining_s: float | None
    #: the agent's monotonic clock when it published [s]: the time base of `phase_at`, as in
    #: `TelemetryResponse`
    agent_time_s: float | None = None
