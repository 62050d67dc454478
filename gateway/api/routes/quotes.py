"""`POST /v1/quotes`: how much the site can shed over a window, and at what cost."""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from agents.protocol import problems
from gateway.api.deps import ServicesDep, v1_router
from gateway.api.schemas import Quote, QuoteRequest

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
    """A quote (body `{"reduction_kw"?, "window_s"?, "confidence"?}`).

    An identical request on an unchanged mix is answered from memory without parsing it again.
    """
    raw = await request.body()
    content = services.quotes.cached(raw)
    if content is None:
        try:
            body = QuoteRequest.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        content = services.quotes.quote(body.reduction_kw, body.window_s, body.confidence, raw)
    return Response(content=content, media_type="application/json")
