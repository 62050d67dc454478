"""The bearer token every agent route that changes a limit requires (HTTP)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Header

from agents.errors import UnauthorizedError


def bearer(token: str) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency refusing (401) a request without `Authorization: Bearer <token>`."""

    async def authorised(authorization: Annotated[str | None, Header()] = None) -> None:
        if not bearer_ok(authorization, token):
            raise UnauthorizedError("a valid bearer token is required to change limits")

    return authorised


def bearer_ok(authorization: str | None, token: str) -> bool:
    """Whether an `Authorization` value (HTTP header, NATS header) carries `token`."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())
