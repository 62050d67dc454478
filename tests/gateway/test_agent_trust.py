"""Trust between the gateway and its agents: a token per node (derived from the site's
secret and the node id, so one node's token opens no other node) and HTTPS to the agents,
verified against the CA the gateway is given."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from agents.protocol import CapCommand, GpuCap, node_token
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.settings import AgentSettings
from agents.simulated import SimulatedBackend
from flexgate.cli import main
from flexgate.serve import ServerThread
from gateway.agentclient import AgentUnreachableError
from gateway.agentclient.http import HttpAgentClient
from gateway.settings import GatewaySettings

SECRET = "site-secret-0123456789abcdef-0123456789"
BASE = {"api_token": "api-token-0123456789abcdef", "read_public": True}


def certificate(tmp_path):
    cert, key = tmp_path / "agent.pem", tmp_path / "agent-key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_a_node_token_secret_replaces_the_shared_token():
    settings = GatewaySettings(**BASE, node_token_secret=SECRET)
    assert settings.token_for("node-01") == node_token(SECRET, "node-01")
    assert settings.token_for("node-01") != settings.token_for("node-02")
    with pytest.raises(ValueError, match="not both"):
        GatewaySettings(**BASE, node_token_secret=SECRET, agent_token="agent-token-0123456789")
    with pytest.raises(ValueError, match="at least 32 characters"):
        GatewaySettings(**BASE, node_token_secret="short-secret-0123")


def test_flexgate_agent_token_prints_the_node_s_token(monkeypatch, capsys):
    monkeypatch.setenv("FLEXGATE_NODE_TOKEN_SECRET", SECRET)
    assert main(["agent-token", "node-01"]) == 0
    assert capsys.readouterr().out.strip() == node_token(SECRET, "node-01")
    monkeypatch.setenv("FLEXGATE_NODE_TOKEN_SECRET", "short")
    assert main(["agent-token", "node-01"]) == 2


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_each_node_opens_to_its_own_token_over_verified_tls(tmp_path):
    cert, key = certificate(tmp_path)
    with pytest.raises(ValueError, match="go together"):
        AgentSettings(lab=True, agent_tls_cert=cert)
    settings = GatewaySettings(**BASE, node_token_secret=SECRET, agents_ca=cert)
    nodes = {
        name: AgentNode(name, SimulatedBackend(2, node_id=name), tmp_path / name)
        for name in ("node-01", "node-02")
    }
    command = CapCommand(plan_id="p", generation=1, lease_s=60, caps=[GpuCap(gpu=0, cap_w=400)])
    tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    with (
        ServerThread(agent_app([nodes["node-01"]], settings.token_for("node-01")), **tls) as one,
        ServerThread(agent_app([nodes["node-02"]], settings.token_for("node-02")), **tls) as two,
    ):
        assert one.startswith("https://")

        async def exchange() -> None:
            client = HttpAgentClient(
                settings.token_for, timeout_s=5, retries=0, ca_file=settings.agents_ca
            )
            assert (await client.health(one)).node_id == "node-01"
            assert (await client.put_caps("node-01", one, command)).status == "acked"
            # node-01's token sent to node-02: refused, nothing changes there.
            wrong = await client.put_caps("node-01", two, command)
            assert (wrong.status, wrong.error[:8]) == ("failed", "HTTP 401")
            limits = {n: node.backend.enforced_limit_w(0) for n, node in nodes.items()}
            assert limits == {"node-01": 400.0, "node-02": 700.0}
            await client.close()
            unverified = HttpAgentClient(settings.token_for, timeout_s=5, retries=0)
            with pytest.raises(AgentUnreachableError, match="certificate"):
                await unverified.health(one)
            await unverified.close()

        asyncio.run(exchange())
