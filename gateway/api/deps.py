"""Dependencies of the routes: the gateway, and the bearer tokens."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.errors import UnauthorizedError
from gateway.services.runtime import Gateway


async def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def _matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


async def write_access(
    gateway: GatewayDep, authorization: Annotated[str | None, Header()] = None
) -> str:
    """Every mutating call: the API token."""
    if not _matches(authorization, gateway.settings.api_token.get_secret_value()):
        raise UnauthorizedError("a valid bearer token (FLEXGATE_API_TOKEN) is required")
    return "api"


async def read_access(
    gateway: GatewayDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Reads (and quotes): open unless FLEXGATE_READ_TOKEN is set; the API token works too."""
    read = gateway.settings.read_token
    if read is None or not read.get_secret_value():
        return
    if not (
        _matches(authorization, read.get_secret_value())
        or _matches(authorization, gateway.settings.api_token.get_secret_value())
    ):
        raise UnauthorizedError("a valid bearer token (FLEXGATE_READ_TOKEN) is required")


Writer = Annotated[str, Depends(write_access)]
READ = [Depends(read_access)]
