"""`/v1/jobs`: the site's job mix, whole or one job at a time."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agents.protocol import problems
from gateway.api.deps import ServicesDep, Writer, v1_router
from gateway.api.schemas.jobs import JobList, JobPut, JobsBody, JobSourceNudged, JobsReplaced
from gateway.errors import ConflictError, InvalidRequestError

router = v1_router()
log = logging.getLogger("flexgate.gateway")


# Documented, not validated again (as `/v1/nodes`): it grows with the site, and the dashboard
# polls it.
@router.get(
    "/jobs", response_model=None, responses={200: {"model": JobList, "description": "the jobs"}}
)
async def list_jobs(services: ServicesDep) -> dict[str, Any]:
    """The job mix as stored (`jobs`); each job's floor and protection with its tier in force
    (`bounds`); the tier table (`tiers`); the scheduler it follows (`source`, null for the
    static mix: its state, and per job its start, end, user and account); each job's PFI in
    force with its error and source, `declared`, `sweep`, `predicted` or `default` (`pfi`)."""
    feed = services.feed
    docs = services.book.docs()
    predictions = services.predictions
    return {
        "jobs": docs,
        "pfi": predictions.job_pfis() if predictions else [],
        "bounds": [
            {
                "id": job.id,
                "tier": job.tier,
                "min_throughput_fraction": job.min_throughput_fraction,
                "protected": job.protected,
            }
            for job in services.book.mix().jobs
        ],
        "tiers": services.book.tiers.rows(),
        "source": None if feed is None else {**feed.state(), "jobs": feed.job_info()},
    }


@router.post(
    "/jobs/refresh", status_code=202, response_model=JobSourceNudged, responses=problems(409)
)
async def refresh_jobs(services: ServicesDep, _: Writer, job: str | None = None) -> dict[str, Any]:
    """Read the job source now (the Slurm prolog and epilog call this, naming the `job`):
    answers at once, the look follows within moments."""
    if services.feed is None:
        raise ConflictError("no job source: the job mix is static (FLEXGATE_JOB_SOURCE=static)")
    log.debug("job source %s: refresh asked for job %s", services.feed.kind, job)
    services.feed.nudge()
    return {"source": services.feed.kind}


@router.put(
    "/jobs",
    response_model=JobsReplaced,
    responses=problems(400, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": JobsBody.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    )
                }
            },
        }
    },
)
async def replace_jobs(request: Request, services: ServicesDep, actor: Writer) -> dict[str, Any]:
    """The whole job mix, as JSON whatever the Content-Type (`curl -d @site.json` sends a
    form type); a job-mix file's site fields are ignored with a warning naming the setting."""
    try:
        body = JobsBody.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    mix = await services.book.replace(body.jobs, actor)
    warnings = body.warnings()
    for warning in warnings:
        log.warning("PUT /v1/jobs: %s", warning)
    return {"jobs": len(mix.jobs), "warnings": warnings}


@router.put("/jobs/{job_id}", response_model=JobPut, responses=problems(400, 422))
async def put_job(
    job_id: str, job: dict[str, Any], services: ServicesDep, actor: Writer, response: Response
) -> dict[str, Any]:
    if job.get("id", job_id) != job_id:
        raise InvalidRequestError(f"the body's id '{job.get('id')}' is not the path's '{job_id}'")
    created = await services.book.put({**job, "id": job_id}, actor)
    response.status_code = 201 if created else 200
    return {"id": job_id, "created": created}


@router.delete("/jobs/{job_id}", status_code=204, responses=problems(404, 422))
async def delete_job(job_id: str, services: ServicesDep, actor: Writer) -> None:
    await services.book.delete(job_id, actor)
