"""The VEN's signature checks, as configured by flexgate, on signed replies.

The VEN's own openleadr client fetches each reply from a loopback server, exactly as it fetches
a VTN's replies; a message is accepted when the client hands back its parsed payload.

Two sources of signed replies:

- generated here, so these tests run in every clone: a throwaway RSA key and self-signed
  certificate (`cryptography`), and messages signed with openleadr's own
  `messaging.create_message(..., cert=, key=)`, the call openleadr's VTN signs its replies
  with; the bad ones are the good one altered after signing, or signed by another key;
- the independent EPRI signature vectors, where `../shared` is beside the clone (they skip
  otherwise). They were signed at 2019-09-11T20:42:00Z and openleadr refuses replies older than
  a few seconds, so its clock is set to that moment.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
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


class Signer:
    """A VTN's signing identity: a throwaway RSA key and its self-signed certificate (PEM)."""

    def __init__(self, name: str) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .sign(key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self.fingerprint = utils.certificate_fingerprint(self.cert_pem.decode())

    def registration(self, registration_id: str = "reg-0123456789") -> bytes:
        """A signed oadrCreatedPartyRegistration, made the way openleadr's VTN makes replies."""
        return messaging.create_message(
            "oadrCreatedPartyRegistration",
            cert=self.cert_pem,
            key=self.key_pem,
            response={"response_code": 200, "response_description": "OK", "request_id": "req-1"},
            vtn_id="TEST_VTN",
            ven_id="ven-1",
            registration_id=registration_id,
            profiles=[{"profile_name": "2.0b", "transports": [{"transport_name": "simpleHttp"}]}],
            requested_oadr_poll_freq=timedelta(seconds=10),
        ).encode()


@pytest.fixture(scope="module")
def vtn() -> Signer:
    return Signer("vtn.test")


@pytest.fixture
def fresh_nonces():
    messaging.NONCE_CACHE.clear()
    yield
    messaging.NONCE_CACHE.clear()


def _span(body: bytes, tag: str, *, inner: bool) -> tuple[int, int]:
    """Where element `tag` (prefixed, as openleadr writes it: `ds:Signature`) lies in `body`:
    the whole element, or only its text when `inner`."""
    start = body.index(b"<" + tag.encode())
    text_at = body.index(b">", start) + 1
    text_end = body.index(b"</" + tag.encode() + b">", text_at)
    return (text_at, text_end) if inner else (start, text_end + len(tag) + 3)


def _edit(body: bytes, tag: str, new: bytes = b"", *, inner: bool = True) -> bytes:
    """`body` altered after signing: element `tag`'s text (or the whole element) replaced."""
    start, end = _span(body, tag, inner=inner)
    return body[:start] + new + body[end:]


def _text(body: bytes, tag: str) -> bytes:
    start, end = _span(body, tag, inner=True)
    return body[start:end]


def test_a_reply_signed_by_the_pinned_vtn_is_accepted(vtn, fresh_nonces):
    kind, payload = serve_to_ven(vtn.registration(), fingerprint=vtn.fingerprint)
    assert kind == "oadrCreatedPartyRegistration"
    assert payload["registration_id"] == "reg-0123456789"


@pytest.mark.parametrize(
    "case",
    [
        "tampered",
        "signed by another key",
        "another key, the pinned certificate attached",
        "nonce emptied",
        "timestamp removed",
        "unsigned",
    ],
)
def test_generated_bad_replies_are_rejected(vtn, fresh_nonces, case):
    good = vtn.registration()
    impostor = Signer("impostor.test").registration()
    body = {
        "tampered": good.replace(b"reg-0123456789", b"reg-9999999999"),
        "signed by another key": impostor,
        "another key, the pinned certificate attached": _edit(
            impostor, "ds:X509Certificate", _text(good, "ds:X509Certificate")
        ),
        "nonce emptied": _edit(good, "dsp:nonce"),
        "timestamp removed": _edit(good, "dsp:timestamp", inner=False),
        "unsigned": _edit(good, "ds:Signature", inner=False),
    }[case]
    assert body != good
    assert serve_to_ven(body, fingerprint=vtn.fingerprint) == (None, {})
    # The same VEN takes the untouched reply: the refusal was the alteration's.
    assert serve_to_ven(good, fingerprint=vtn.fingerprint)[0] == "oadrCreatedPartyRegistration"


def test_a_generated_reply_seen_twice_is_rejected_the_second_time(vtn, fresh_nonces):
    body = vtn.registration()
    assert serve_to_ven(body, fingerprint=vtn.fingerprint)[0] == "oadrCreatedPartyRegistration"
    assert serve_to_ven(body, fingerprint=vtn.fingerprint) == (None, {})


def test_a_generated_reply_signed_long_ago_is_rejected(vtn, fresh_nonces, monkeypatch):
    body = vtn.registration()

    class Later(datetime):  # openleadr's clock, one minute after the signature
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(minutes=1)

    monkeypatch.setattr(messaging, "datetime", Later)
    assert serve_to_ven(body, fingerprint=vtn.fingerprint) == (None, {})


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
