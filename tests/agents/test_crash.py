"""Failure rules: originals saved before the first change survive a SIGKILL and come back
at the next start; SIGTERM restores on the way out."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from flexgate.serve import free_port
from tests.agents.fake_agent import TOKEN
from tests.conftest import ROOT


def start(port, state_dir, driver):
    log = driver.with_suffix(".log")
    with log.open("ab") as errors:  # the child keeps its own copy of the file
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.agents.fake_agent",
                str(port),
                str(state_dir),
                str(driver),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    process.wait()
    raise RuntimeError(f"the agent did not start: {log.read_text()}")


def driver_limits(driver):
    return json.loads(driver.read_text())["limits_mw"]


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
