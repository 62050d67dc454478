"""Request bodies and answers of the gateway API (docs/gateway.md, "API")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from flexmodel.baselines import RULE_NAMES, is_preset


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: A job-mix file's site fields, and the gateway setting that decides each instead.
SITE_FIELDS = {
    "overhead_factor": "FLEXGATE_OVERHEAD_FACTOR",
    "overhead_factor_stderr": "FLEXGATE_OVERHEAD_FACTOR_STDERR",
    "static_load_kw": "FLEXGATE_STATIC_LOAD_KW",
}


class JobsBody(_Strict):
    """The whole job mix. The same file `flexgate allocate` reads is accepted: its site fields
    (`overhead_factor`, `overhead_factor_stderr`, `static_load_kw`) are ignored with a warning
    naming the gateway setting that decides them (or the meter's calibration)."""

    jobs: list[dict[str, Any]]
    overhead_factor: float | None = None
    overhead_factor_stderr: float | None = None
    static_load_kw: float | None = None

    def warnings(self) -> list[str]:
        return [
            f"{name} {getattr(self, name)!r} in the body is ignored: the gateway uses {setting} "
            "(or the meter's calibration, docs/gateway.md)"
            for name, setting in SITE_FIELDS.items()
            if getattr(self, name) is not None
        ]

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


class QuoteRequest(_Strict):
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


class _Open(BaseModel):
    """A response: the documented fields, and any the model adds later."""

    model_config = ConfigDict(extra="allow")


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


class SettledInterval(_Open):
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


class SettlementTotals(_Open):
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


class SettlementBaseline(_Open):
    days_used: list[str] = Field(description="the local days the baseline averages")
    adjustment_factor: float
    adjustment_kw: float
    capped: bool
    adjusted: bool


class SettledRule(_Open):
    rule: str = Field(description="the preset (flexmodel.baselines.PRESETS)")
    kind: str
    parameters: dict[str, Any]
    reason: str | None = Field(description="why the rule gives no baseline; null when it does")
    baseline: SettlementBaseline | None
    intervals: list[SettledInterval]
    totals: SettlementTotals


class Settlement(_Open):
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


class Event(_Open):
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


class JobCap(_Open):
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


class Plan(_Open):
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


class SiteState(_Open):
    gpu_power_kw: float
    facility_power_kw: float
    baseline_gpu_kw: float
    baseline_facility_kw: float
    shed_facility_kw: float
    overhead_factor: float
    active_event_id: str | None


class Quote(_Open):
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


class Health(_Open):
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


class MeterIntervalDoc(_Open):
    start: str
    end: str
    mean_kw: float | None = Field(description="the mean of its samples [kW]; null in a gap")
    samples: int
    coverage: float = Field(description="samples over those the meter period gives it, 0 to 1")
    gap: bool = Field(description="more than one sample missing (none at all: coverage 0)")
    estimated_share: float
    estimated: bool = Field(description="any sample estimated, or taken while the meter faulted")
    fault: bool = Field(description="any sample taken while the meter was faulted or suspected")


class MeterSampleDoc(_Open):
    at: str
    power_kw: float = Field(description="the meter's reading, or the estimate [kW]")
    estimated: bool
    fault: bool


class MeterHistoryDoc(_Open):
    """`GET /v1/site/meter`: `intervals` for 1m to 30m, `samples` for raw."""

    interval: str
    interval_s: int | None
    start: str
    end: str
    source: str = Field(description="the meter now, or `estimate`")
    meter_period_s: float
    intervals: list[MeterIntervalDoc] | None = None
    samples: list[MeterSampleDoc] | None = None


class JobBounds(_Open):
    """A job's floor and protection with its tier in force."""

    tier: int | None = Field(description="its flexibility tier; null when untagged")
    min_throughput_fraction: float
    protected: bool


class JobTierBounds(JobBounds):
    id: str


class JobPfi(_Open):
    """A job's PFI in force, its standard error and where it comes from."""

    id: str
    source: str = Field(
        description="measured, combined, declared, sweep, predicted (with `error_basis`) or default"
    )
    pfi: float | None = Field(description="null for a sweep no cap slowed beyond its noise")
    pfi_stderr: float | None
    dram_copy_product: float | None = Field(description="the feature a prediction rests on")
    feature_samples: int


class Tier(_Open):
    tier: int
    slowdown: float
    min_throughput_fraction: float
    protected: bool


class JobList(_Open):
    """`GET /v1/jobs`."""

    jobs: list[dict[str, Any]] = Field(description="the job mix as stored")
    pfi: list[JobPfi]
    bounds: list[JobTierBounds]
    tiers: list[Tier]
    source: dict[str, Any] | None = Field(
        description="the scheduler followed (its state, and per job its start, end, user and "
        "account); null for the static mix"
    )


class JobsReplaced(_Open):
    """`PUT /v1/jobs`."""

    jobs: int = Field(description="how many jobs the mix now holds")
    warnings: list[str] = Field(description="a job-mix file's site fields, ignored")


class JobPut(_Open):
    """`PUT /v1/jobs/{id}`: 201 when created, 200 when replaced."""

    id: str
    created: bool


class JobSourceNudged(_Open):
    """`POST /v1/jobs/refresh`."""

    source: str = Field(description="the job source asked to look now")


class JobDetail(_Open):
    """`GET /v1/jobs/{id}`."""

    job: dict[str, Any] = Field(description="the job as declared")
    pfi: JobPfi | None
    bounds: JobBounds
    curve: dict[str, Any] = Field(
        description="where the curve in force comes from, the PFI with its error and grid, "
        "the latest measured fit"
    )


class JobCurve(_Open):
    """`GET /v1/jobs/{id}/curve`: the measured points and the fit."""

    id: str


class ProbeJob(_Open):
    id: str
    caps_w: list[float] = Field(description="the caps probed, uncapped first [W]")
    measured: list[dict[str, Any]] = Field(description="the agent's stretch at each step")


class ProbeStop(_Open):
    id: str
    reason: str


class Probe(_Open):
    """A characterisation probe (`POST /v1/characterise`, `GET /v1/characterise`)."""

    id: str
    status: str = Field(description="running, completed, interrupted or failed")
    actor: str
    jobs: list[ProbeJob]
    hold_s: list[float]
    steps: list[int] = Field(description="the levels in the order run (0: uncapped)")
    level: int
    step: int
    skipped: list[dict[str, str]]
    stopped: list[ProbeStop] = Field(description="jobs that went no lower, and why")
    reason: str | None
    curves_changed: list[str]


class ProbeState(_Open):
    """`GET /v1/characterise`: the probe running or last run (null before the first)."""

    probe: Probe | None


class Predictor(_Open):
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


class Nodes(_Open):
    """`GET /v1/nodes`: each node's state as the gateway knows it."""

    nodes: list[dict[str, Any]]
