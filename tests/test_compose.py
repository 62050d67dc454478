"""docker-compose.yml: valid for docker-compose, and speaking the settings flexgate reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from agents.settings import AgentSettings
from flexgate.mockvtn import read_scenario
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


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (.ci/run installs it)",
)
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
    used = set(re.findall(r"\b(FLEXGATE_[A-Z_]+):", COMPOSE.read_text()))
    assert used, "no FLEXGATE_ settings found"
    assert used <= known, sorted(used - known)


def test_the_example_scenario_can_be_issued():
    scenario = read_scenario(EXAMPLES / "scenario.json")
    assert [e["signal_name"] for e in scenario["events"]] == ["LOAD_DISPATCH", "SIMPLE"]
