"""`/v1/jobs/{id}` and its curve, and characterisation: probing jobs' caps outside events."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agents.protocol import problems
from gateway.api.deps import Services, ServicesDep, Writer, v1_router
from gateway.api.schemas.characterise import JobCurve, JobDetail, Probe, ProbeState
from gateway.errors import NotFoundError
from gateway.services.characterise import Characteriser
from gateway.services.curves import JobCurves
from gateway.units import rounded

router = v1_router()


class CharacteriseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[str] | None = Field(
        default=None, description="the jobs to probe; null or absent: every unmeasured job"
    )


def _parts(services: Services) -> tuple[JobCurves, Characteriser]:
    assert services.curves is not None
    assert services.characteriser is not None
    return services.curves, services.characteriser


def _job(services: Services, job_id: str) -> tuple[dict[str, Any], Any]:
    doc = next((d for d in services.book.docs() if d.get("id") == job_id), None)
    if doc is None:
        raise NotFoundError(f"no job '{job_id}'")
    job = services.book.mix().by_id[job_id]
    return doc, job


@router.get("/jobs/{job_id}", response_model=JobDetail, responses=problems(404))
async def get_job(job_id: str, services: ServicesDep) -> dict[str, Any]:
    """The job as declared (`job`), its bounds with its tier in force, and its curve: where the
    curve in force comes from (`declared`, `measured` or `default`), the PFI with its standard
    error and grid, and the latest measured fit."""
    curves, _ = _parts(services)
    doc, job = _job(services, job_id)
    return rounded(
        {
            "job": doc,
            "pfi": services.predictions.job_pfi(doc) if services.predictions else None,
            "bounds": {
                "tier": job.tier,
                "min_throughput_fraction": job.min_throughput_fraction,
                "protected": job.protected,
            },
            "curve": curves.describe(doc, curves.latest().get(job_id), points=False),
        }
    )


@router.get("/jobs/{job_id}/curve", response_model=JobCurve, responses=problems(404))
async def get_curve(job_id: str, services: ServicesDep) -> dict[str, Any]:
    """The job's measured points (per cap level: mean power, throughput with their errors,
    where and when each was measured) and the fit (flexmodel.sweeps: PFI, standard error,
    grid, the monotone curve, the points set aside)."""
    curves, _ = _parts(services)
    doc, _ = _job(services, job_id)
    return rounded({"id": job_id, **curves.describe(doc, curves.latest().get(job_id), points=True)})


@router.post(
    "/jobs/{job_id}/characterise",
    status_code=202,
    response_model=Probe,
    responses=problems(404, 409, 422),
)
async def characterise_job(job_id: str, services: ServicesDep, actor: Writer) -> dict[str, Any]:
    """Probe this job's caps now (answers at once; `GET /v1/characterise` follows it)."""
    _, characteriser = _parts(services)
    return (await characteriser.characterise([job_id], actor)).doc()


@router.post(
    "/characterise", status_code=202, response_model=Probe, responses=problems(400, 404, 409, 422)
)
async def characterise(
    services: ServicesDep, actor: Writer, body: CharacteriseBody | None = None
) -> dict[str, Any]:
    """Probe the jobs named, or every job without a measured curve (within the budget)."""
    _, characteriser = _parts(services)
    jobs = body.jobs if body is not None else None
    return (await characteriser.characterise(jobs, actor)).doc()


@router.get("/characterise", response_model=ProbeState)
async def probe_state(services: ServicesDep) -> dict[str, Any]:
    """The probe running or last run (`probe`, null before the first)."""
    _, characteriser = _parts(services)
    current = characteriser.current
    return {"probe": None if current is None else current.doc()}
