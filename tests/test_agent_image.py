"""The agent's own image (docker/agent.Dockerfile): built here from the agent-only install, it
starts an agent on simulated GPUs with a read-only root, answers /health, runs as an ordinary
user, and holds none of the gateway's dependencies.

Needs a Docker engine (.ci/run starts one and makes the base images offline). Where none
answers the module skips, saying so, unless FLEXGATE_REQUIRE_DOCKER=1 (CI): then it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import httpx
import pytest

from flexgate.imagebuild import AGENT_IMAGE, build_agent_image, run
from flexgate.serve import free_port
from tests.conftest import wait_for
from tests.test_install import NOT_ON_A_NODE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKEN = "image-test-agent-token-0123"


def engine_answers() -> str | None:
    """None when a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "docker is not installed (.ci/run installs it)"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"no Docker engine answers: {done.stderr.strip()}"


@pytest.fixture(scope="module", autouse=True)
def image() -> None:
    missing = engine_answers()
    if missing and os.environ.get("FLEXGATE_REQUIRE_DOCKER") == "1":
        pytest.fail(f"FLEXGATE_REQUIRE_DOCKER=1 but {missing}")
    if missing:
        pytest.skip(missing)
    build_agent_image()


def docker(*args: str) -> str:
    return run(["docker", *args], timeout_s=120)


def test_the_image_starts_an_agent_that_answers_health():
    port, name = free_port(), f"flexgate-agent-image-test-{uuid.uuid4().hex[:8]}"
    docker(
        "run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp",
        "-e", f"FLEXGATE_AGENT_TOKEN={TOKEN}", "-e", "FLEXGATE_AGENT_NODE_ID=image-node",
        "-p", f"127.0.0.1:{port}:9100",
        AGENT_IMAGE, "agent", "--backend", "sim", "--gpus", "4",
    )  # fmt: skip
    try:

        def health() -> dict | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            except httpx.HTTPError:
                return None

        answer = wait_for(health, "the agent's /health from the container", seconds=60, every_s=0.5)
        assert (answer["backend"], answer["node_id"], answer["gpus"]) == ("sim", "image-node", 4)
        assert answer["configuration"]["state_dir"] == "/var/lib/flexgate-agent"
        caps = httpx.put(
            f"http://127.0.0.1:{port}/v1/caps",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "plan_id": "p",
                "generation": 1,
                "lease_s": 60,
                "caps": [{"gpu": 0, "cap_w": 400}],
            },
            timeout=10,
        )
        # The originals were saved on the read-only root's one writable folder, the volume.
        assert caps.status_code == 200, caps.text
        assert caps.json()["results"][0]["error"] is None
    finally:
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
        docker("rm", "-f", "-v", name)
    assert "agent starting" in logs


def test_the_image_holds_the_agent_alone_as_an_ordinary_user_and_no_build_secret():
    assert docker("image", "inspect", "-f", "{{.Config.User}}", AGENT_IMAGE).strip() == "flexgate"
    probe = "import importlib.util as u, sys; print(*(m for m in sys.argv[1:] if u.find_spec(m)))"
    found = docker(
        "run", "--rm", "--entrypoint", "python", AGENT_IMAGE, "-c", probe, "pynvml", *NOT_ON_A_NODE
    )  # fmt: skip
    assert found.split() == ["pynvml"]
    # The CA bundle given to pip, and the pip configuration naming it, stay in the build stage.
    check = "test ! -e /tmp/build-ca && test ! -e /etc/pip.conf && echo clean"
    assert docker("run", "--rm", "--entrypoint", "sh", AGENT_IMAGE, "-c", check).strip() == "clean"
