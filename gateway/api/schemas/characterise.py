"""A job as characterised (its detail and curve) and the probes that measure it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.api.schemas import OpenAnswer
from gateway.api.schemas.jobs import JobBounds, JobPfi


class JobDetail(OpenAnswer):
    """`GET /v1/jobs/{id}`."""

    job: dict[str, Any] = Field(description="the job as declared")
    pfi: JobPfi | None
    bounds: JobBounds
    curve: dict[str, Any] = Field(
        description="where the curve in force comes from, the PFI with its error and grid, "
        "the latest measured fit"
    )


class JobCurve(OpenAnswer):
    """`GET /v1/jobs/{id}/curve`: the measured points and the fit."""

    id: str


class ProbeJob(OpenAnswer):
    id: str
    caps_w: list[float] = Field(description="the caps probed, uncapped first [W]")
    measured: list[dict[str, Any]] = Field(description="the agent's stretch at each step")


class ProbeStop(OpenAnswer):
    id: str
    reason: str


class Probe(OpenAnswer):
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


class ProbeState(OpenAnswer):
    """`GET /v1/characterise`: the probe running or last run (null before the first)."""

    probe: Probe | None
