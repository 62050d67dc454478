"""`/v1/predictor` and `/v1/jobs/{id}`: the PFI predictor's fit and errors, and one job with
the PFI in force for it (declared, from its sweep, predicted from its telemetry, or default)."""

from __future__ import annotations

from typing import Any

from agents.protocol import problems
from gateway.api.deps import ServicesDep, v1_router
from gateway.errors import NotFoundError
from gateway.services.predictions import Predictions

router = v1_router()


def _predictions(services: ServicesDep) -> Predictions:
    assert services.predictions is not None  # create_app always builds it
    return services.predictions


@router.get("/predictor")
async def get_predictor(services: ServicesDep) -> dict[str, Any]:
    """The predictor in force (`fit`: the study's, or the site's refit once it has
    `site_records_needed` measured jobs), its in-sample R^2 and its leave-one-out and
    leave-one-group-out R^2 and RMSE; the study's fit it starts from; the site's records."""
    return _predictions(services).doc()


@router.get("/jobs/{job_id}", responses=problems(404))
async def get_job(job_id: str, services: ServicesDep) -> dict[str, Any]:
    """One job as stored (`job`), its PFI in force (`pfi`: value, standard error, source, and
    the telemetry feature a prediction rests on), its floor and protection (`bounds`)."""
    doc = next((d for d in services.book.docs() if d.get("id") == job_id), None)
    if doc is None:
        raise NotFoundError(f"no job '{job_id}'")
    job = next(j for j in services.book.mix().jobs if j.id == job_id)
    return {
        "job": doc,
        "pfi": _predictions(services).job_pfi(doc),
        "bounds": {
            "tier": job.tier,
            "min_throughput_fraction": job.min_throughput_fraction,
            "protected": job.protected,
        },
    }
