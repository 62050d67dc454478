"""`/v1/predictor`: the PFI predictor's fit and errors."""

from __future__ import annotations

from typing import Any

from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas.predictor import Predictor
from gateway.services.predictions import Predictions

router = v1_router()


def _predictions(services: ServicesDep) -> Predictions:
    assert services.predictions is not None  # create_app always builds it
    return services.predictions


@router.get("/predictor", response_model=Predictor)
async def get_predictor(services: ServicesDep) -> dict[str, Any]:
    """The predictor in force (`fit`: the study's, or the site's refit once it has
    `site_records_needed` measured jobs), its in-sample R^2 and its leave-one-out and
    leave-one-group-out R^2 and RMSE; the study's fit it starts from; the site's records."""
    return _predictions(services).doc()
