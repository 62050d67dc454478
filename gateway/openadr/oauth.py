"""OAuth2 client credentials for the OpenADR 3.1 VEN: a bearer token, fetched when needed and
fetched again before it expires.

The token service is the one `FLEXGATE_VTN_TOKEN_URL` names, else the one the VTN names at
`GET /auth/server` (OpenADR 3.1.0, issue 226); it must pass the same HTTPS rule as the VTN.
The client credentials go in the form body by default (`client_id`, `client_secret`: the 3.1.0
schema's clientCredentialRequest requires them there, and the Alliance's reference VTN refuses a
request without them), or as HTTP Basic when FLEXGATE_VTN_CLIENT_AUTH=basic (RFC 6749 2.3.1
allows either, and a server may refuse a request that uses both, so never both). A token is
refreshed once REFRESH_SHARE of its lifetime has passed (on the clock passed in), so a request
never carries one about to expire; a VTN that still answers 401 makes the caller `invalidate`
it and retry once. The secret and the token are never logged or put in an error message.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import SecretStr, ValidationError

from gateway.clock import Clock
from gateway.openadr.oadr31 import AuthServerInfo, first_error
from gateway.settings import insecure_url

#: A token is replaced once this share of its lifetime has passed.
REFRESH_SHARE = 0.8
#: A token service that states no lifetime: tokens are replaced this often [s].
DEFAULT_LIFETIME_S = 300.0


class VtnAuthError(Exception):
    """The token service refused or could not be reached; the reason, never the secret."""


class TokenSource:
    def __init__(
        self,
        http: httpx.AsyncClient,
        clock: Clock,
        *,
        vtn_url: str,
        client_id: str,
        client_secret: SecretStr,
        token_url: str = "",
        allow_http: bool = False,
        client_auth: str = "body",
    ) -> None:
        self.http, self.clock = http, clock
        self.vtn_url = vtn_url.rstrip("/")
        self.client_id, self._secret = client_id, client_secret
        self.token_url, self.allow_http = token_url, allow_http
        self.client_auth = client_auth  #: "body" or "basic"
        self._token: str | None = None
        self._renew_at = 0.0
        self.fetched = 0  #: tokens fetched so far

    async def token(self) -> str:
        """A bearer token that is not about to expire."""
        if self._token is None or self.clock.monotonic() >= self._renew_at:
            await self._fetch()
        assert self._token is not None
        return self._token

    def invalidate(self) -> None:
        """The VTN refused the token: the next request fetches a new one."""
        self._token = None

    async def _fetch(self) -> None:
        url = self.token_url or await self._discover()
        try:
            answer = await self.http.post(url, **self._credentials())
        except httpx.HTTPError as exc:
            raise VtnAuthError(f"token service {url} unreachable: {type(exc).__name__}") from None
        if answer.status_code != 200:
            raise VtnAuthError(
                f"token service {url} refused client {self.client_id!r}: HTTP "
                f"{answer.status_code} {_error_of(answer)}"
            )
        try:
            body = answer.json()
            token = body["access_token"]
            lifetime = float(body.get("expires_in") or DEFAULT_LIFETIME_S)
        except (ValueError, KeyError, TypeError):
            raise VtnAuthError(f"token service {url}: the answer has no access_token") from None
        if not isinstance(token, str) or not token or lifetime <= 0:
            raise VtnAuthError(f"token service {url}: no usable token in the answer")
        self._token = token
        self._renew_at = self.clock.monotonic() + REFRESH_SHARE * lifetime
        self.fetched += 1

    def _credentials(self) -> dict[str, Any]:
        """The token request's form and authentication, as FLEXGATE_VTN_CLIENT_AUTH says."""
        form = {"grant_type": "client_credentials"}
        secret = self._secret.get_secret_value()
        if self.client_auth == "basic":
            return {"data": form, "auth": (self.client_id, secret)}
        return {"data": {**form, "client_id": self.client_id, "client_secret": secret}}

    async def _discover(self) -> str:
        where = f"{self.vtn_url}/auth/server"
        try:
            answer = await self.http.get(where)
            answer.raise_for_status()
            url = AuthServerInfo.model_validate(answer.json()).token_url
        except httpx.HTTPError as exc:
            raise VtnAuthError(f"{where}: {type(exc).__name__}: {exc}") from None
        except (ValueError, ValidationError) as exc:
            raise VtnAuthError(f"{where}: not an authServerInfo: {first_error(exc)}") from None
        if problem := insecure_url(url, allow_http=self.allow_http):
            raise VtnAuthError(f"the token URL the VTN names is refused: {problem}")
        self.token_url = url
        return url


def _error_of(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return ""
    if isinstance(body, dict):
        return str(body.get("error_description") or body.get("error") or body.get("detail") or "")
    return ""
