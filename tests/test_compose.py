"""docker-compose.yml: valid for docker-compose, speaking the settings flexgate reads, holding no
secret and publishing only the gateway, on loopback. tests/test_compose_lab.py runs it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from agents.settings import AgentSettings
from flexgate.lab.compose import BUILD_CA, main
from flexgate.lab.mockvtn import read_scenario
from gateway.settings import GatewaySettings
from tests.conftest import EXAMPLES, ROOT

COMPOSE = ROOT / "docker-compose.yml"
SECRETS = {
    "FLEXGATE_API_TOKEN": "compose-api-token-0123456789",
    "FLEXGATE_AGENT_TOKEN": "compose-agent-token-0123456789",
    "POSTGRES_PASSWORD": "compose-postgres-password",
}


def compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=60,
        check=False,
    )


needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (.ci/run installs it)",
)


@needs_compose
def test_compose_file_is_valid_and_refuses_to_start_without_its_secrets():
    valid = compose("--profile", "postgres", "config", "-q", env=SECRETS)
    assert valid.returncode == 0, valid.stderr
    services = compose("--profile", "postgres", "config", "--services", env=SECRETS).stdout.split()
    assert sorted(services) == ["agent-1", "agent-2", "gateway", "mock-vtn", "postgres"]
    for missing in ("FLEXGATE_API_TOKEN", "FLEXGATE_AGENT_TOKEN"):
        refused = compose("config", "-q", env={k: v for k, v in SECRETS.items() if k != missing})
        assert refused.returncode != 0
        assert f"set {missing}" in refused.stderr


def test_every_flexgate_variable_in_the_compose_file_is_a_setting():
    known = {f"FLEXGATE_{name.upper()}" for name in GatewaySettings.model_fields} | {
        f"FLEXGATE_{name.upper()}" for name in AgentSettings.model_fields
    }
    # Environment keys only: ${FLEXGATE_COMPOSE_PORT} is for docker-compose itself.
    used = set(re.findall(r"^\s+(FLEXGATE_[A-Z_]+):", COMPOSE.read_text(), re.MULTILINE))
    assert used, "no FLEXGATE_ settings found"
    assert used <= known, sorted(used - known)


def test_the_example_scenario_can_be_issued():
    scenario = read_scenario(EXAMPLES / "scenario.json")
    assert [e["signal_name"] for e in scenario["events"]] == ["LOAD_DISPATCH", "SIMPLE"]


def test_no_secret_is_written_in_the_compose_file():
    secret = re.compile(r"^\s+([A-Z_]*(?:TOKEN|PASSWORD|DATABASE_URL)):\s*(.*)$", re.MULTILINE)
    found = secret.findall(COMPOSE.read_text())
    assert found, "no secret settings found"
    for name, value in found:
        required = value.startswith("${") and ":?" in value
        assert required or value == "${FLEXGATE_DATABASE_URL:-sqlite:////data/gateway.db}", name


@needs_compose
def test_only_the_gateway_publishes_a_port_on_loopback_and_every_service_has_an_init():
    services = yaml.safe_load(compose("--profile", "postgres", "config", env=SECRETS).stdout)[
        "services"
    ]
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert published == {"gateway": ["127.0.0.1:8000:8000/tcp"]}
    for name, service in services.items():
        assert service.get("init") is True, name
        assert "user" not in service, f"{name}: the image's non-root user is overridden"
        assert not service.get("privileged"), name


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLEXGATE_BUILD_CA", "/nonexistent/ca.crt"),
        ("FLEXGATE_COMPOSE_PORT", "80x"),
        ("FLEXGATE_COMPOSE_PORT", "70000"),
    ],
)
def test_the_compose_lab_refuses_bad_settings_before_starting_anything(
    variable, value, monkeypatch, capsys
):
    monkeypatch.setenv(variable, value)
    bundle = BUILD_CA.read_bytes() if BUILD_CA.exists() else None
    assert main(["--project", "flexgate-never-started"]) == 2
    said = capsys.readouterr().out
    assert variable in said
    assert value in said
    assert (BUILD_CA.read_bytes() if BUILD_CA.exists() else None) == bundle
