"""A GPU node installs the agent alone (`flexgate[agent]`), and it starts: a fresh venv, the
package built from this checkout, its dependencies from the package index. Nothing of the
gateway's (grid protocols, store, Kubernetes client, plots) comes with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from flexgate.serve import free_port
from tests.conftest import ROOT

#: What the gateway and the labs need and a GPU node must not have to install.
NOT_ON_A_NODE = (
    "openleadr",
    "kubernetes",
    "grpc",
    "matplotlib",
    "paho",
    "pymodbus",
    "sqlmodel",
    "aiohttp",
    "apscheduler",
)


@pytest.mark.timeout(900)
def test_a_gpu_node_installs_the_agent_alone_and_it_starts(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{ROOT}[agent]"],
        capture_output=True,
        text=True,
        timeout=800,
    )
    if installed.returncode != 0 and "No matching distribution" in installed.stderr:
        pytest.skip(f"no package index answers here: {installed.stderr.splitlines()[-1]}")
    assert installed.returncode == 0, installed.stderr
    probe = "import importlib.util as u, sys; print(*(m for m in sys.argv[1:] if u.find_spec(m)))"
    found = subprocess.run(
        [python, "-c", probe, *NOT_ON_A_NODE], capture_output=True, text=True, check=True
    )
    assert found.stdout.split() == []
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
        "FLEXGATE_AGENT_TOKEN": "install-test-agent-token-0123",
        "FLEXGATE_AGENT_STATE_DIR": str(tmp_path / "agent"),
        "FLEXGATE_AGENT_BACKEND": "sim",
    }
    log = tmp_path / "agent.log"
    with log.open("wb") as errors:
        agent = subprocess.Popen(
            [str(venv / "bin" / "flexgate"), "agent", "--port", str(port)],
            cwd=tmp_path,  # not this checkout: the installed package, not the source tree
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.2)
        assert answer.json()["backend"] == "sim"
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    # Its own namespace is still checked without the gateway's names to read.
    misspelt = subprocess.run(
        [str(venv / "bin" / "flexgate"), "agent", "--port", str(port)],
        cwd=tmp_path,
        env=env | {"FLEXGATE_AGENT_BACKNED": "sim"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert misspelt.returncode == 2
    assert "FLEXGATE_AGENT_BACKNED (did you mean FLEXGATE_AGENT_BACKEND?)" in misspelt.stderr
