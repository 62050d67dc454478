"""The job mix: the body that replaces it, and the answers that show it."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from gateway.api.schemas import OpenAnswer, StrictBody

#: A job-mix file's site fields, and the gateway setting that decides each instead.
SITE_FIELDS = {
    "overhead_factor": "FLEXGATE_OVERHEAD_FACTOR",
    "overhead_factor_stderr": "FLEXGATE_OVERHEAD_FACTOR_STDERR",
    "static_load_kw": "FLEXGATE_STATIC_LOAD_KW",
}


class JobsBody(StrictBody):
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


class JobBounds(OpenAnswer):
    """A job's floor and protection with its tier in force."""

    tier: int | None = Field(description="its flexibility tier; null when untagged")
    min_throughput_fraction: float
    protected: bool


class JobTierBounds(JobBounds):
    id: str


class JobPfi(OpenAnswer):
    """A job's PFI in force, its standard error and where it comes from."""

    id: str
    source: str = Field(
        description="measured, combined, declared, sweep, predicted (with `error_basis`) or default"
    )
    pfi: float | None = Field(description="null for a sweep no cap slowed beyond its noise")
    pfi_stderr: float | None
    dram_copy_product: float | None = Field(description="the feature a prediction rests on")
    feature_samples: int


class Tier(OpenAnswer):
    tier: int
    slowdown: float
    min_throughput_fraction: float
    protected: bool


class JobList(OpenAnswer):
    """`GET /v1/jobs`."""

    jobs: list[dict[str, Any]] = Field(description="the job mix as stored")
    pfi: list[JobPfi]
    bounds: list[JobTierBounds]
    tiers: list[Tier]
    source: dict[str, Any] | None = Field(
        description="the scheduler followed (its state, and per job its start, end, user and "
        "account); null for the static mix"
    )


class JobsReplaced(OpenAnswer):
    """`PUT /v1/jobs`."""

    jobs: int = Field(description="how many jobs the mix now holds")
    warnings: list[str] = Field(description="a job-mix file's site fields, ignored")


class JobPut(OpenAnswer):
    """`PUT /v1/jobs/{id}`: 201 when created, 200 when replaced."""

    id: str
    created: bool


class JobSourceNudged(OpenAnswer):
    """`POST /v1/jobs/refresh`."""

    source: str = Field(description="the job source asked to look now")
