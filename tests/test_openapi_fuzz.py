"""schemathesis against both OpenAPI documents, on real servers on loopback: no 5xx, and every
answer as its document says (status code, content type, body schema), and nothing the
requests set off (an event's start, a plan) logs an error. Bounded examples and a fixed seed,
so CI runs the same cases every time (docs/reliability.md). The schemathesis command line is
what an operator would run too."""

import logging
import subprocess
import sys
from pathlib import Path

from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from tests.gateway.conftest import API_TOKEN, running_site

AGENT_TOKEN = "fuzz-agent-token-0123456789"
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
    )
)
EXAMPLES_PER_OPERATION = 50
SEED = 20261129


def schemathesis(url: str, token: str, workdir: Path) -> None:
    """The schemathesis command, run in `workdir` (it keeps a cache where it runs)."""
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{url}/openapi.json",
        f"--checks={CHECKS}",
        f"--max-examples={EXAMPLES_PER_OPERATION}",
        f"--seed={SEED}",
        "--workers=1",
        "--no-color",
        f"--header=Authorization: Bearer {token}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]


def no_errors_logged(caplog) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_the_gateway_answers_every_request_as_documented(tmp_path, caplog):
    with running_site(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}") as site:
        schemathesis(str(site.api.base_url).rstrip("/"), API_TOKEN, tmp_path)
        assert site.api.get("/health").json()["status"] == "ok"
    no_errors_logged(caplog)


def test_the_agent_answers_every_request_as_documented(tmp_path, caplog):
    node = AgentNode("node-01", SimulatedBackend(4, node_id="node-01"), tmp_path / "node-01")
    with ServerThread(agent_app([node], AGENT_TOKEN)) as url:
        schemathesis(url, AGENT_TOKEN, tmp_path)
    no_errors_logged(caplog)
