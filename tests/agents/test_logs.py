"""The log an operator reads: `flexgate agent` as a process, one line per decision on stderr."""

import os
import signal
import subprocess
import sys

import httpx

from flexgate.serve import free_port
from tests.conftest import ROOT, wait_for

TOKEN = "log-test-token-0123456789"


def lines(path, what):
    return [line for line in path.read_text().splitlines() if f" {what} " in line]


def listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.TransportError:
        return False
    return True


def test_the_agent_logs_start_caps_lease_expiry_and_stop(tmp_path):
    port, log = free_port(), tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")}
    with log.open("w") as stderr:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "flexgate.cli", "agent", "--port", str(port)),
                *("--node-id", "node-07", "--gpus", "2", "--state-dir", str(tmp_path / "state")),
                *("--backend", "sim"),
            ],
            cwd=ROOT,
            env=env | {"FLEXGATE_AGENT_TOKEN": TOKEN, "FLEXGATE_AGENT_LEASE_CHECK_S": "0.05"},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        (start,) = wait_for(lambda: lines(log, "agent starting"), "the start line", 30)
        assert f"node=node-07 backend=sim gpus=2 host=127.0.0.1 port={port}" in start
        # The start line comes before the server listens: wait for it to answer.
        wait_for(lambda: listening(port), "the agent listening", 30)

        def put(generation, lease_s, caps):
            answer = httpx.put(
                f"http://127.0.0.1:{port}/v1/caps",
                headers={"Authorization": f"Bearer {TOKEN}"},
                json={
                    "plan_id": "plan-a",
                    "generation": generation,
                    "lease_s": lease_s,
                    "caps": [{"gpu": g, "cap_w": w} for g, w in caps.items()],
                },
                timeout=5,
            )
            assert answer.status_code == 200, answer.text

        put(1, 0.5, {0: 400.0})
        (cap,) = wait_for(lambda: lines(log, "cap set"), "the cap line")
        assert "node=node-07 gpu=0 requested_w=400.0 enforced_w=400.0" in cap
        assert "plan=plan-a generation=1" in cap
        (expiry,) = wait_for(lambda: lines(log, "lease expired"), "the lease expiry line")
        assert " WARNING " in expiry
        assert "restored_gpus=0 failed_gpus=none" in expiry

        put(2, 600.0, {1: 300.0})
        wait_for(lambda: len(lines(log, "cap set")) == 2, "the second cap line")
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)
        (stop,) = lines(log, "stopping")
        assert "node=node-07 plan=plan-a generation=2 restored_gpus=1 failed_gpus=none" in stop
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
