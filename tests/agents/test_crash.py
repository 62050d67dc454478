"""Failure rules: originals saved before the first change survive a SIGKILL and come back
at the next start; SIGTERM restores on the way out."""

import json
import os
import signal
import time
from datetime import UTC, datetime

import httpx

from flexgate.serve import ServerThread, free_port
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.agents.fake_agent import TOKEN, driver_limits
from tests.agents.fake_agent import start_agent as start
from tests.conftest import wait_for


def cap(port, watts):
    answer = httpx.put(
        f"http://127.0.0.1:{port}/v1/caps",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json={
            "plan_id": "p",
            "generation": 1,
            "lease_s": 600,
            "caps": [{"gpu": 0, "cap_w": watts}],
        },
        timeout=5,
    )
    assert answer.status_code == 200, answer.text


def test_sigkill_mid_lease_then_restart_restores_the_original(tmp_path):
    state, driver, port = tmp_path / "state", tmp_path / "driver.json", free_port()
    agent = start(port, state, driver)
    cap(port, 400.0)
    assert driver_limits(driver) == [400_000, 650_000]
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(timeout=10)
    # Killed: nothing restored, but the original is on disk.
    assert driver_limits(driver) == [400_000, 650_000]
    saved = json.loads((state / "original-limits.json").read_text())["gpus"]
    assert saved == {"GPU-fake-0000": {"index": 0, "original_w": 650.0}}
    again = start(port, state, driver)  # the next start restores before serving
    try:
        assert driver_limits(driver) == [650_000, 650_000]
        assert json.loads((state / "original-limits.json").read_text())["gpus"] == {}
    finally:
        again.terminate()
        again.wait(timeout=10)


def test_sigterm_restores_every_gpu(tmp_path):
    state, driver, port = tmp_path / "state", tmp_path / "driver.json", free_port()
    agent = start(port, state, driver)
    cap(port, 300.0)
    assert driver_limits(driver)[0] == 300_000
    agent.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal for its parent to see.
    assert agent.wait(timeout=10) in (0, -signal.SIGTERM)
    assert driver_limits(driver) == [650_000, 650_000]


def test_an_agent_killed_mid_event_gets_its_caps_back_when_it_returns(tmp_path, recovery):
    """SIGKILL an agent during a gateway event and start it again: it restores its originals
    at start, and the gateway's next reconciliation puts the event's caps back."""
    port, driver = free_port(), tmp_path / "driver.json"
    agent = start(port, tmp_path / "state", driver)
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}",
        api_token="crash-test-api-token-0123",
        agent_token=TOKEN,
        agents=f"http://127.0.0.1:{port}",
        allow_simulated=True,  # the agents run simulated GPUs
        lease_s=30.0,
        reconcile_period_s=0.5,
        recovery_ramp_s=0.2,
        recovery_steps=1,
    )
    auth = {"Authorization": "Bearer crash-test-api-token-0123"}
    job = {
        "id": "j",
        "gpus": 2,
        "power_w": 650.0,
        "throughput": 1e4,
        "pfi": 1.5,
        "placement": [{"node": "crash-node", "gpus": [0, 1]}],
    }
    try:
        with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as api:
            assert api.put("/v1/jobs", json={"jobs": [job]}, headers=auth).status_code == 200
            start_at = datetime.now(UTC).isoformat()
            body = {"reduction_kw": 0.3, "start": start_at, "duration_s": 120}
            assert api.post("/v1/events", json=body, headers=auth).status_code == 201
            wait_for(lambda: all(mw < 650_000 for mw in driver_limits(driver)), "caps")
            capped = driver_limits(driver)
            os.kill(agent.pid, signal.SIGKILL)
            agent.wait(10)
            agent = start(port, tmp_path / "state", driver)  # restores the originals at start
            back = time.monotonic()
            wait_for(lambda: driver_limits(driver) == capped, "the caps put back")
            recovery("agent restarted: its caps back after it answers", time.monotonic() - back)
    finally:
        agent.terminate()
        agent.wait(10)
