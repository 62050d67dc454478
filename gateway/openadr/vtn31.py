"""The VTN's REST API, as the 3.1 VEN calls it: each request with a fresh OAuth2 token, lists
read page by page, every failure a `VtnError` with the reason (and the HTTP status)."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import ValidationError

from gateway.openadr.oadr31 import first_error
from gateway.openadr.oauth import TokenSource

PAGE = 50  #: objects asked for per request (the VTN's `limit`)


class VtnError(Exception):
    """The VTN refused a request or could not be reached: the reason (and the HTTP status of a
    refusal)."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


class VtnClient:
    def __init__(self, http: httpx.AsyncClient, tokens: TokenSource, vtn_url: str) -> None:
        self.http, self.tokens, self.vtn = http, tokens, vtn_url.rstrip("/")

    async def call(
        self, method: str, path: str, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """One request with a fresh token; a 401 fetches a new token and tries once more, and
        so does a connection the VTN closed as it was reused (a keep-alive race)."""
        for attempt in (1, 2):
            token = await self.tokens.token()
            try:
                answer = await self.http.request(
                    method,
                    f"{self.vtn}{path}",
                    json=json,
                    params=params,
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.HTTPError as exc:
                if attempt == 1 and isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError):
                    continue
                raise VtnError(f"{method} {path}: unreachable ({type(exc).__name__})") from None
            if answer.status_code == 401 and attempt == 1:
                self.tokens.invalidate()
                continue
            if answer.status_code >= 400:
                raise VtnError(
                    f"{method} {path}: HTTP {answer.status_code} {_detail(answer)}",
                    answer.status_code,
                )
            return answer.json() if answer.content else None
        raise AssertionError("unreachable")

    async def list(self, path: str, params: dict[str, Any] | None = None) -> list[Any]:
        """Every object the VTN lists at `path`, page by page."""
        out: list[Any] = []
        while True:
            page = await self.call(
                "GET", path, params={**(params or {}), "skip": len(out), "limit": PAGE}
            )
            if not isinstance(page, list):
                raise VtnError(f"GET {path}: the answer is not a list")
            out += page
            if len(page) < PAGE:
                return out

    async def aclose(self) -> None:
        await self.http.aclose()


def valid(model: Any, raw: Any, what: str) -> Any:
    """`raw` read as `model`, or a VtnError naming what the VTN sent wrong."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise VtnError(
            f"the VTN's {what} is not an OpenADR 3.1 {what}: {first_error(exc)}"
        ) from None


def _detail(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or "")
    return ""
