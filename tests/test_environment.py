"""What the environment may hold: every `FLEXGATE_*` variable is a setting of the gateway or
the agent, or named as meant for another program; anything else refuses to start, saying which
name and the nearest known one (a misspelt setting would silently take its default)."""

from __future__ import annotations

import os

import pytest

from agents.settings import AgentSettings
from flexgate.cli import main
from gateway.settings import GatewaySettings

GATEWAY = {
    "api_token": "api-token-0123456789abcdef",
    "agent_token": "agent-token-0123456789ab",
    "read_public": True,
}
AGENT = {"agent_token": "agent-token-0123456789ab", "agent_backend": "sim"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.upper().startswith("FLEXGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # nothing a start might write lands in the repository


def test_a_misspelt_gateway_setting_is_refused_naming_the_likely_one(monkeypatch):
    monkeypatch.setenv("FLEXGATE_DATABSE_URL", "postgresql+psycopg://db/flexgate")
    monkeypatch.setenv("FLEXGATE_METER_ULR", "modbus://meter:502")
    with pytest.raises(ValueError, match="unknown settings") as refused:
        GatewaySettings(**GATEWAY)
    said = str(refused.value)
    assert "FLEXGATE_DATABSE_URL (did you mean FLEXGATE_DATABASE_URL?)" in said
    assert "FLEXGATE_METER_ULR (did you mean FLEXGATE_METER_URL?)" in said
    # In the lab too: there a misspelling misleads just the same.
    with pytest.raises(ValueError, match="FLEXGATE_DATABSE_URL"):
        GatewaySettings(lab=True)


def test_each_program_leaves_the_other_s_settings_alone_and_checks_its_own(monkeypatch):
    monkeypatch.setenv("FLEXGATE_AGENT_BACKEND", "nvml")  # the agent's, in a shared env file
    monkeypatch.setenv("FLEXGATE_DATABASE_URL", "sqlite:///g.db")  # the gateway's
    assert GatewaySettings(**GATEWAY).database_url == "sqlite:///g.db"
    assert AgentSettings(agent_token=AGENT["agent_token"]).agent_backend == "nvml"
    monkeypatch.setenv("FLEXGATE_AGENT_BAKCEND", "nvml")
    with pytest.raises(ValueError, match="did you mean FLEXGATE_AGENT_BACKEND"):
        AgentSettings(**AGENT)


def test_variables_for_other_programs_pass_when_known_or_listed(monkeypatch):
    monkeypatch.setenv("FLEXGATE_REQUIRE_NATS", "1")  # the test suite's switches
    monkeypatch.setenv("FLEXGATE_TEST_POSTGRES_URL", "postgresql://x")
    monkeypatch.setenv("FLEXGATE_COMPOSE_PORT", "8001")
    monkeypatch.setenv("FLEXGATE_SITE_NAME", "north")
    with pytest.raises(ValueError, match="FLEXGATE_SITE_NAME"):
        GatewaySettings(**GATEWAY)
    monkeypatch.setenv("FLEXGATE_IGNORE_VARIABLES", "flexgate_site_name, FLEXGATE_OTHER")
    assert GatewaySettings(**GATEWAY).lab is False
    assert AgentSettings(**AGENT).lab is False


def test_the_cli_refuses_in_one_line_and_exit_2_before_starting(monkeypatch, capsys):
    monkeypatch.setenv("FLEXGATE_DATABSE_URL", "postgresql+psycopg://db/flexgate")
    # Port -1 is refused too, after the names: were they not checked, that error would show
    # here (and nothing would start and hang the test).
    assert main(["gateway", "--lab", "--port", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "did you mean FLEXGATE_DATABASE_URL?" in err[0]
    monkeypatch.delenv("FLEXGATE_DATABSE_URL")
    # Only the command line knows both programs' names: a misspelt agent prefix is caught there.
    monkeypatch.setenv("FLEXGATE_AGNET_BACKEND", "nvml")
    assert main(["agent", "--lab", "--port", "-1"]) == 2
    assert "did you mean FLEXGATE_AGENT_BACKEND?" in capsys.readouterr().err


def test_an_agent_outside_the_lab_must_state_its_backend(monkeypatch):
    with pytest.raises(ValueError, match=r"FLEXGATE_AGENT_BACKEND \(--backend\) must be stated"):
        AgentSettings(agent_token=AGENT["agent_token"])
    assert AgentSettings(lab=True).agent_backend == "sim"
    assert AgentSettings(**AGENT).agent_backend == "sim"


def test_the_agent_s_health_says_what_it_runs_on(tmp_path):
    from agents.run import build_node

    settings = AgentSettings(**AGENT, agent_gpus=2, agent_state_dir=tmp_path / "state")
    health = build_node(settings).health()
    assert health.backend == "sim"
    assert health.configuration is not None
    assert health.configuration["backend"] == "sim"
    assert (health.configuration["transport"], health.configuration["tls"]) == ("http", False)
    assert "token" not in str(health.model_dump())


def test_an_nvml_agent_without_nvml_fails_in_one_line(monkeypatch, capsys):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a GPU node: the agent would start
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    monkeypatch.setenv("FLEXGATE_AGENT_TOKEN", AGENT["agent_token"])
    assert main(["agent", "--backend", "nvml", "--port", "0", "--state-dir", "state"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--backend nvml: NVML is not usable here" in err[0]


def test_reads_need_a_token_outside_the_lab_unless_made_public():
    closed = {k: v for k, v in GATEWAY.items() if k != "read_public"}
    with pytest.raises(ValueError, match="FLEXGATE_READ_TOKEN must be set outside the lab"):
        GatewaySettings(**closed)
    with pytest.raises(ValueError, match="FLEXGATE_READ_TOKEN must be a secret"):
        GatewaySettings(**closed, read_token="changeme")
    assert GatewaySettings(**closed, read_token="read-token-0123456789ab").read_public is False
    assert GatewaySettings(**closed, read_public=True).read_token is None
    assert GatewaySettings(lab=True).read_token is None  # the lab reads openly
