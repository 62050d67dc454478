"""`POST /v1/quotes`: how much the site can shed over a window, and at what cost."""

from __future__ import annotations

import json
from datetime import timedelta

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agents.protocol import problems
from gateway.api.deps import Services, ServicesDep, v1_router
from gateway.api.schemas.quotes import Quote, QuoteRequest
from gateway.services.counted import QUOTE_SHEDS

router = v1_router()


@router.post(
    "/quotes",
    responses={200: {"model": Quote, "description": "a quote"}, **problems(400, 422)},
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": QuoteRequest.model_json_schema(
                        ref_template="#/components/schemas/{model}"
                    )
                }
            },
        }
    },
)
async def quotes(request: Request, services: ServicesDep) -> Response:
    """A quote (body `{"reduction_kw"?, "window_s"?, "confidence"?, "baseline"?, "start"?}`).

    An identical request on an unchanged mix is answered from memory without parsing it again.
    With `baseline` (a preset), `counted` adds what the utility would count of the quote's
    reduction, achievable and firm kW over [start, start + window_s) (never kept: it reads the
    meter history and the site's level now).
    """
    raw = await request.body()
    content = services.quotes.cached(raw)
    if content is None:
        try:
            body = QuoteRequest.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        if body.baseline is None:
            content = services.quotes.quote(body.reduction_kw, body.window_s, body.confidence, raw)
        else:
            content = await _counted(services, body)
    return Response(content=content, media_type="application/json")


async def _counted(services: Services, body: QuoteRequest) -> bytes:
    """The quote with `counted`, what `body.baseline` would count of its sheds."""
    assert body.baseline is not None
    doc = json.loads(services.quotes.quote(body.reduction_kw, body.window_s, body.confidence, None))
    start = body.start or services.events.clock.now()
    sheds = {"reduction_kw": body.reduction_kw, **{k: doc[k] for k in QUOTE_SHEDS[1:]}}
    end = start + timedelta(seconds=body.window_s)
    doc["counted"] = await services.events.counted.doc(body.baseline, start, end, sheds)
    return json.dumps(doc, allow_nan=False).encode()
