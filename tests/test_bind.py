"""The agent and the gateway, started with their defaults, listen on loopback only: the
kernel's socket tables (/proc/net/tcp, tcp6) say where each one listens."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flexgate.serve import free_port
from tests.conftest import ROOT

LISTEN = "0A"
LOOPBACK = "0100007F"  #: 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)


def listening_addresses(port: int) -> list[str]:
    """Every local address with a socket listening on `port`, IPv4 and IPv6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port:
                found.append(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
@pytest.mark.parametrize("service", ["agent", "gateway"])
def test_a_service_started_with_its_defaults_listens_on_loopback_only(tmp_path, service):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
        "FLEXGATE_AGENT_TOKEN": "bind-test-agent-token-0123",
        "FLEXGATE_API_TOKEN": "bind-test-api-token-0123",
        "FLEXGATE_AGENT_STATE_DIR": str(tmp_path / "agent"),
        "FLEXGATE_AGENT_BACKEND": "sim",
        "FLEXGATE_READ_PUBLIC": "true",
        "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'gateway.db'}",
    }
    command = [sys.executable, "-m", "flexgate.cli", service, "--port", str(port)]
    log = tmp_path / f"{service}.log"
    with log.open("wb") as errors:  # the child keeps its own copy of the file
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{service} did not start"
            time.sleep(0.1)
        assert listening_addresses(port) == [LOOPBACK]
    finally:
        process.terminate()
        process.wait(10)
