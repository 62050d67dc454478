"""OpenADR 3.1 security: HTTPS to the VTN outside the lab (plain HTTP only to loopback, only
when allowed), OAuth2 credentials required, the token replaced before it expires (on a stepped
clock shared with the mock VTN on a real server)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError

from flexgate.lab.mockvtn31 import LAB_CLIENT_ID, LAB_CLIENT_SECRET, MockVtn31
from flexgate.serve import ServerThread
from gateway.clock import SteppedClock
from gateway.openadr.oauth import REFRESH_SHARE, TokenSource, VtnAuthError
from gateway.settings import GatewaySettings

TOKENS = {"api_token": "api-token-0123456789abcdef", "agent_token": "agent-token-0123456789abc"}
CLIENT = {"vtn_client_id": "ven-1", "vtn_client_secret": "secret-0123456789"}


def settings(**changes):
    return GatewaySettings(**{**TOKENS, "openadr": "3.1", **CLIENT, **changes})


@pytest.mark.parametrize(
    ("url", "allow", "reason"),
    [
        ("http://vtn.example/openadr3", False, "plain HTTP to another machine"),
        ("http://vtn.example/openadr3", True, "plain HTTP to another machine"),
        ("http://10.0.0.5:8080", True, "must be https://"),
        ("http://127.0.0.1:8080", False, "FLEXGATE_VTN_ALLOW_HTTP=true"),
        ("ftp://vtn.example", True, "is not an https:// URL"),
    ],
)
def test_a_vtn_url_that_is_not_https_is_refused_with_the_reason(url, allow, reason):
    with pytest.raises(ValidationError, match=reason):
        settings(vtn_url=url, vtn_allow_http=allow)


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("vtn_token_url", "http://auth.example/token"),
        ("ven_callback_url", "http://gateway.example/openadr3/notifications"),
    ],
)
def test_a_token_or_callback_url_that_is_not_https_is_refused_too(name, url):
    with pytest.raises(ValidationError, match=f"FLEXGATE_{name.upper()}"):
        settings(vtn_url="https://vtn.example", **{name: url})


@pytest.mark.parametrize(
    "url", ["https://vtn.example/openadr3", "http://127.0.0.1:8080", "http://localhost:1/x"]
)
def test_https_anywhere_and_http_on_loopback_when_allowed_are_accepted(url):
    assert settings(vtn_url=url, vtn_allow_http=True).vtn_url == url


def test_the_lab_allows_http_on_loopback_only():
    lab = {"lab": True, "api_token": "", "agent_token": ""}
    assert settings(vtn_url="http://127.0.0.1:9", **lab).lab
    with pytest.raises(ValidationError, match="another machine"):
        settings(vtn_url="http://192.0.2.1:9", **lab)


def test_31_needs_client_credentials_and_no_fingerprint():
    with pytest.raises(ValidationError, match="FLEXGATE_VTN_CLIENT_ID and"):
        GatewaySettings(**TOKENS, openadr="3.1", vtn_url="https://vtn.example")
    assert settings(vtn_url="https://vtn.example").vtn_fingerprint is None


@pytest.mark.parametrize("secret", ["changeme", LAB_CLIENT_SECRET])
def test_a_placeholder_client_secret_is_refused_outside_the_lab(secret):
    with pytest.raises(ValidationError, match="placeholder or the lab's secret"):
        settings(vtn_url="https://vtn.example", vtn_client_secret=secret)


def test_the_lab_uses_the_mock_vtns_lab_client_when_none_is_given():
    lab = GatewaySettings(lab=True, openadr="3.1", vtn_url="http://127.0.0.1:9")
    assert lab.vtn_client_id == LAB_CLIENT_ID
    assert lab.vtn_client_secret.get_secret_value() == LAB_CLIENT_SECRET


def test_20b_is_unchanged_it_still_needs_the_fingerprint():
    with pytest.raises(ValidationError, match="FLEXGATE_VTN_FINGERPRINT"):
        GatewaySettings(**TOKENS, vtn_url="https://vtn.example/OpenADR2/Simple/2.0b")


def test_the_secret_is_not_in_the_settings_repr():
    assert CLIENT["vtn_client_secret"] not in repr(settings(vtn_url="https://vtn.example"))


def test_the_token_is_replaced_before_it_expires():
    clock = SteppedClock()
    vtn = MockVtn31(token_lifetime_s=100.0, clock=clock)
    with ServerThread(vtn.app) as url:

        async def scenario():
            async with httpx.AsyncClient() as http:
                tokens = TokenSource(
                    http,
                    clock,
                    vtn_url=url,
                    client_id=LAB_CLIENT_ID,
                    client_secret=SecretStr(LAB_CLIENT_SECRET),
                    allow_http=True,
                )
                first = await tokens.token()  # the token URL from GET /auth/server
                assert tokens.token_url == f"{url}/auth/token"
                clock.step(REFRESH_SHARE * 100.0 - 1.0)
                assert await tokens.token() == first  # still well within its life
                clock.step(2.0)
                second = await tokens.token()
                assert second != first  # replaced at 80 % of its life, before it expired
                assert tokens.fetched == 2
                read = await http.get(
                    f"{url}/programs", headers={"Authorization": f"Bearer {first}"}
                )
                assert read.status_code == 200  # the old one still worked when it was replaced
                clock.step(100.0)
                read = await http.get(
                    f"{url}/programs", headers={"Authorization": f"Bearer {first}"}
                )
                assert read.status_code == 401  # and the VTN refuses it once expired
                tokens.invalidate()
                assert await tokens.token() not in (first, second)

        asyncio.run(scenario())


def test_a_refused_client_gets_the_reason_without_the_secret():
    vtn = MockVtn31()
    with ServerThread(vtn.app) as url:

        async def scenario():
            async with httpx.AsyncClient() as http:
                tokens = TokenSource(
                    http,
                    SteppedClock(),
                    vtn_url=url,
                    client_id=LAB_CLIENT_ID,
                    client_secret=SecretStr("wrong-secret-value-42"),
                    allow_http=True,
                )
                with pytest.raises(VtnAuthError) as refused:
                    await tokens.token()
                return str(refused.value)

        reason = asyncio.run(scenario())
    assert "refused client 'flexgate-lab-ven': HTTP 401 invalid_client" in reason
    assert "wrong-secret-value-42" not in reason


def test_a_token_url_the_vtn_names_over_plain_http_elsewhere_is_refused():
    """A VTN (here a bare server answering only the discovery) naming a token service on
    another machine over plain HTTP: the VEN would send its secret in the clear."""
    vtn = FastAPI()

    @vtn.get("/auth/server")
    async def elsewhere():
        return {"tokenURL": "http://auth.example/token"}

    with ServerThread(vtn) as url:

        async def scenario():
            async with httpx.AsyncClient() as http:
                tokens = TokenSource(
                    http,
                    SteppedClock(),
                    vtn_url=url,
                    client_id=LAB_CLIENT_ID,
                    client_secret=SecretStr(LAB_CLIENT_SECRET),
                    allow_http=True,
                )
                with pytest.raises(VtnAuthError, match="another machine"):
                    await tokens.token()

        asyncio.run(scenario())
