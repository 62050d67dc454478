"""`/v1/jobs`: the site's job mix, whole or one job at a time."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from agents.protocol import problems
from gateway.api.deps import ServicesDep, Writer, v1_router
from gateway.api.schemas import JobsBody
from gateway.errors import InvalidRequestError

router = v1_router()


@router.get("/jobs")
async def list_jobs(services: ServicesDep) -> dict[str, Any]:
    return {"jobs": services.book.docs()}


@router.put("/jobs", responses=problems(400, 422))
async def replace_jobs(body: JobsBody, services: ServicesDep, actor: Writer) -> dict[str, Any]:
    mix = await services.book.replace(body.jobs, actor)
    return {"jobs": len(mix.jobs)}


@router.put("/jobs/{job_id}", responses=problems(400, 422))
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
