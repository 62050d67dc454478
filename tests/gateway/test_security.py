"""Reads behind FLEXGATE_READ_TOKEN, and HTTPS when a certificate and key are set."""

import logging
import shutil
import ssl
import subprocess
from datetime import UTC, datetime

import httpx
import pytest

from flexgate.serve import ServerThread
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.conftest import AGENT_TOKEN, API, API_TOKEN, Outbound, running_site

READ_TOKEN = "read-token-0123456789abcdef"


def settings(tmp_path, **extra):
    return GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'g.db'}",
        api_token=API_TOKEN,
        agent_token=AGENT_TOKEN,
        **extra,
    )


def test_the_read_token_guards_every_read_and_quote(tmp_path):
    with (
        ServerThread(create_app(settings(tmp_path, read_token=READ_TOKEN))) as url,
        httpx.Client(base_url=url) as api,
    ):
        reads = [
            ("GET", "/v1/jobs"),
            ("GET", "/v1/events"),
            ("GET", "/v1/site"),
            ("GET", "/v1/nodes"),
            ("GET", "/v1/sync"),
            ("GET", "/metrics"),
            ("POST", "/v1/quotes"),
        ]
        for method, path in reads:
            assert api.request(method, path, json={}).status_code == 401, path
            for token in (READ_TOKEN, API_TOKEN):
                answer = api.request(
                    method, path, json={}, headers={"Authorization": f"Bearer {token}"}
                )
                assert answer.status_code == 200, (path, answer.text)
        assert api.get("/health").status_code == 200  # liveness stays open


def test_placeholder_tokens_are_refused_outside_the_lab(tmp_path):
    with pytest.raises(ValueError, match="FLEXGATE_API_TOKEN"):
        GatewaySettings(database_url="sqlite://", api_token="changeme", agent_token=AGENT_TOKEN)
    lab = GatewaySettings(database_url="sqlite://", lab=True)
    assert lab.api_token.get_secret_value()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_https_when_a_certificate_and_key_are_set(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    configured = settings(tmp_path, tls_cert=cert, tls_key=key)
    app = create_app(configured)
    with ServerThread(app, ssl_certfile=str(cert), ssl_keyfile=str(key)) as url:
        assert url.startswith("https://")
        with httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=cert)) as api:
            assert api.get("/health").json()["status"] == "ok"
    with pytest.raises(ValueError, match="go together"):
        settings(tmp_path, tls_cert=cert)


def run_a_short_event(site) -> None:
    """A 2 s event from now, until it has completed."""
    start = datetime.now(UTC).isoformat()
    created = site.api.post(
        "/v1/events", json={"reduction_kw": 5.0, "start": start, "duration_s": 2}, headers=API
    )
    assert created.status_code == 201, created.text
    event_id = created.json()["id"]
    site.wait(lambda: site.api.get(f"/v1/events/{event_id}").json()["status"] == "completed")


def test_tokens_never_reach_the_logs(site, caplog):
    """A whole event, wrong tokens included, logged at DEBUG by every logger in the process:
    neither the API token nor the agent token appears."""
    caplog.set_level(logging.DEBUG)
    api = site.api
    assert (
        api.post("/v1/events", json={}, headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    assert (
        api.put(
            "/v1/jobs", json={"jobs": []}, headers={"Authorization": f"Bearer {API_TOKEN}x"}
        ).status_code
        == 401
    )
    run_a_short_event(site)
    assert caplog.records, "nothing was logged: the check would prove nothing"
    for secret in (API_TOKEN, AGENT_TOKEN):
        assert secret not in caplog.text


def test_the_gateway_calls_only_its_configured_agents(tmp_path, database_url):
    """Every outbound request of a whole event (discovery, dispatch, reconciliation,
    telemetry, recovery) goes to a configured agent URL, and to nothing else."""
    outbound = Outbound()
    called = outbound.urls
    with running_site(tmp_path, database_url, http_trace=[outbound.trace]) as site:
        run_a_short_event(site)
        site.api.get("/v1/site")  # telemetry from every agent
        site.wait(lambda: all(w == 700.0 for ws in site.limits().values() for w in ws))
        allowed = site.settings.agent_urls
    assert called, "no outbound request was seen: the check would prove nothing"
    assert all(any(url.startswith(f"{a}/") for a in allowed) for url in called), called
