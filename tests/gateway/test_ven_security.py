"""The VEN's signature checks, as configured by flexgate, on the EPRI signature vectors.

The VEN's own openleadr client fetches each vector from a loopback server, exactly as it fetches
a VTN's replies; a message is accepted when the client hands back its parsed payload. The
vectors were signed at 2019-09-11T20:42:00Z and openleadr refuses replies older than a few
seconds, so its clock is set to that moment.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from aiohttp import web
from openleadr import messaging, utils

from flexgate.serve import free_port
from gateway.openadr.ven import MAX_MESSAGE_BYTES, Ven
from gateway.settings import GatewaySettings
from tests.conftest import ROOT
from tests.gateway.conftest import AGENT_TOKEN, API_TOKEN

SIGNED_AT = datetime(2019, 9, 11, 20, 42, 0, tzinfo=UTC)
PREFIX = "created_party_registration-with-signature"


class SigningClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return SIGNED_AT if tz is not None else SIGNED_AT.replace(tzinfo=None)


def settings(**changes) -> GatewaySettings:
    return GatewaySettings(
        database_url="sqlite://", api_token=API_TOKEN, agent_token=AGENT_TOKEN, **changes
    )


def test_a_ven_without_a_vtn_fingerprint_is_refused_outside_the_lab():
    with pytest.raises(ValueError, match="FLEXGATE_VTN_FINGERPRINT must be set"):
        settings(vtn_url="https://vtn.example/OpenADR2/Simple/2.0b")
    assert settings(vtn_url="https://vtn.example", vtn_fingerprint="AB:CD").vtn_fingerprint
    assert settings(vtn_url="https://vtn.example", vtn_allow_unsigned=True).vtn_allow_unsigned
    with pytest.raises(ValueError, match="FLEXGATE_VEN_CERT and FLEXGATE_VEN_KEY"):
        settings(vtn_url="https://vtn.example", vtn_fingerprint="AB:CD", ven_cert="cert.pem")


def fetch(shared, name: str) -> tuple[str | None, dict]:
    """What the VEN's client makes of vector `name` when the VTN replies with it."""
    vectors = shared / "vectors" / "openadr2b"
    der = (vectors / "certificate-attached-to-signature.der").read_bytes()
    body = (vectors / name).read_bytes()
    return serve_to_ven(body, fingerprint=utils.certificate_fingerprint_from_der(der))


def serve_to_ven(body: bytes, fingerprint: str | None, reply=None) -> tuple[str | None, dict]:
    """Reply `body` (or what the `reply` handler answers) to the VEN's client from a loopback
    server; what the client hands back."""
    port = free_port()
    pinned = {"vtn_fingerprint": fingerprint} if fingerprint else {"vtn_allow_unsigned": True}
    ven = Ven(settings(vtn_url=f"http://127.0.0.1:{port}/OpenADR2/Simple/2.0b", **pinned))

    async def whole(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/xml")

    async def run() -> tuple[str | None, dict]:
        app = web.Application()
        app.router.add_post("/OpenADR2/Simple/2.0b/EiRegisterParty", reply or whole)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            answer = await ven.client._perform_request("EiRegisterParty", b"<query/>")
            return answer if answer is not None else (None, {})
        finally:
            await ven.client.client_session.close()
            await runner.cleanup()

    return asyncio.run(run())


@pytest.fixture
def signing_clock(monkeypatch):
    monkeypatch.setattr(messaging, "datetime", SigningClock)
    messaging.NONCE_CACHE.clear()
    yield
    messaging.NONCE_CACHE.clear()


def test_the_good_signed_reply_is_accepted(shared, signing_clock):
    kind, payload = fetch(shared, f"{PREFIX}.xml")
    assert kind == "oadrCreatedPartyRegistration"
    assert payload["registration_id"] == "752e4cc6c5413baa1a80"


@pytest.mark.parametrize(
    "case",
    [
        "tampered",
        "wrong-certificate",  # passes openleadr without a fingerprint: hence the refusal above
        "empty-nonce",
        "timestamp-missing",
        "no-reference-to-ReplayProtect",
        "no-reference-to-oadrSignedObject",
        "two-oadrSignedObject",
    ],
)
def test_every_bad_signed_reply_is_rejected(shared, signing_clock, case):
    assert fetch(shared, f"{PREFIX}-{case}.xml") == (None, {})


def test_a_replayed_reply_is_rejected(shared, signing_clock):
    assert fetch(shared, f"{PREFIX}.xml")[0] == "oadrCreatedPartyRegistration"
    assert fetch(shared, f"{PREFIX}.xml") == (None, {})


def test_a_good_reply_signed_long_ago_is_rejected(shared):
    assert fetch(shared, f"{PREFIX}.xml") == (None, {})


HUGE_BYTES = 16 * MAX_MESSAGE_BYTES


def test_a_reply_of_declared_excessive_size_is_refused_unread(caplog):
    assert serve_to_ven(b"<" * HUGE_BYTES, None) == (None, {})
    assert f"{HUGE_BYTES} bytes exceeds {MAX_MESSAGE_BYTES}" in caplog.text


def test_a_streamed_reply_is_cut_at_the_limit(caplog):
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"Content-Type": "application/xml"})
        await response.prepare(request)  # chunked: no size announced
        try:
            while sent < HUGE_BYTES:
                await response.write(b"<" * 65536)
                sent += 65536
        except (ConnectionError, RuntimeError):  # the VEN hung up
            pass
        return response

    assert serve_to_ven(b"", None, reply=endless) == (None, {})
    assert f"exceeds {MAX_MESSAGE_BYTES} bytes" in caplog.text
    assert sent < HUGE_BYTES / 2  # the VEN stopped reading, far short of the whole


def entity_bomb(levels: int = 9) -> bytes:
    """The "billion laughs": 10**levels copies of "lol" from a few hundred bytes."""
    entities = "".join(
        f'<!ENTITY l{i} "{(f"&l{i - 1};" if i else "lol") * (10 if i else 1)}">'
        for i in range(levels)
    )
    return (
        f'<?xml version="1.0"?><!DOCTYPE p [{entities}]>'
        f'<oadr:oadrPayload xmlns:oadr="http://openadr.org/oadr-2.0b/2012/07">&l{levels - 1};'
        "</oadr:oadrPayload>"
    ).encode()


EXTERNAL_ENTITY = (
    b'<?xml version="1.0"?><!DOCTYPE p [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
    b'<oadr:oadrPayload xmlns:oadr="http://openadr.org/oadr-2.0b/2012/07">&e;</oadr:oadrPayload>'
)


@pytest.mark.parametrize("payload", [entity_bomb(), EXTERNAL_ENTITY], ids=["bomb", "external"])
def test_hostile_xml_is_rejected_without_expanding_anything(payload):
    # In a child process: openleadr's own parser segfaults on the bomb, and a regression must
    # fail this test, not kill the test session.
    script = (
        "import sys\n"
        "from gateway.openadr.xml import harden_parser\n"
        "harden_parser()\n"
        "from openleadr import messaging\n"
        "try:\n"
        "    messaging.validate_xml_schema(sys.stdin.buffer.read())\n"
        "    print('accepted')\n"
        "except Exception as exc:\n"
        "    print('rejected', type(exc).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=payload,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, f"the parser crashed (exit {result.returncode})"
    assert result.stdout.decode().split() == ["rejected", "XMLSyntaxError"]
