"""`flexgate agent --restore` (a unit's ExecStopPost): a killed agent's GPUs get their saved
original limits back from the state directory, on the fake NVML whose driver state outlives
the agent as a real driver's does; refused while an agent runs; a failed restore says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from agents.errors import InvalidSetupError
from agents.nvml import NvmlBackend
from agents.restore import RestoreFailedError, run_restore
from agents.settings import AgentSettings
from flexgate.serve import free_port
from tests.agents.fake_agent import ORIGINAL_MW, TOKEN, driver_limits, start_agent
from tests.agents.fake_nvml import FakeNvml
from tests.agents.test_crash import cap

NODE = "crash-node"


def settings_for(tmp_path, port: int) -> AgentSettings:
    return AgentSettings(
        agent_token=TOKEN,
        agent_backend="nvml",
        agent_node_id=NODE,
        agent_state_dir=tmp_path,
        agent_port=port,
    )


def killed_agent_left_a_cap(tmp_path) -> tuple:
    """An agent over the fake NVML capped GPU 0 and was SIGKILLed: the cap stays."""
    state, driver, port = tmp_path / NODE, tmp_path / "driver.json", free_port()
    agent = start_agent(port, state, driver, NODE)
    cap(port, 400.0)
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(timeout=10)
    assert driver_limits(driver) == [400_000, ORIGINAL_MW]
    return state, driver, port


def test_restore_gives_a_killed_agents_gpus_their_originals_back(tmp_path):
    state, driver, port = killed_agent_left_a_cap(tmp_path)
    backend = NvmlBackend(nvml=FakeNvml(gpus=2, start_mw=ORIGINAL_MW, state_file=driver))
    lines = run_restore(settings_for(tmp_path, port), backend)
    assert lines == [f"GPU 0: restored to {ORIGINAL_MW / 1000:g} W"]
    assert driver_limits(driver) == [ORIGINAL_MW, ORIGINAL_MW]
    assert json.loads((state / "original-limits.json").read_text())["gpus"] == {}
    again = NvmlBackend(nvml=FakeNvml(gpus=2, state_file=driver))
    assert run_restore(settings_for(tmp_path, port), again) == [
        f"{NODE}: nothing to restore (no GPU left capped)"
    ]


def test_a_gpu_that_cannot_be_restored_stays_listed_for_the_next_start(tmp_path):
    state, driver, port = killed_agent_left_a_cap(tmp_path)
    fake = FakeNvml(gpus=2, start_mw=ORIGINAL_MW, state_file=driver)
    backend = NvmlBackend(nvml=fake)
    fake.lost.add(0)
    with pytest.raises(RestoreFailedError, match="GPU 0: not restored"):
        run_restore(settings_for(tmp_path, port), backend)
    assert driver_limits(driver) == [400_000, ORIGINAL_MW]
    saved = json.loads((state / "original-limits.json").read_text())["gpus"]
    assert saved == {"GPU-fake-0000": {"index": 0, "original_w": ORIGINAL_MW / 1000}}


def test_restore_is_refused_while_an_agent_answers_on_its_port(tmp_path):
    state, driver, port = tmp_path / NODE, tmp_path / "driver.json", free_port()
    agent = start_agent(port, state, driver, NODE)
    try:
        cap(port, 350.0)
        backend = NvmlBackend(nvml=FakeNvml(gpus=2, state_file=driver))
        with pytest.raises(InvalidSetupError, match="an agent answers on"):
            run_restore(settings_for(tmp_path, port), backend)
        assert driver_limits(driver) == [350_000, ORIGINAL_MW]  # nothing changed
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_the_cli_one_shot_says_what_it_restored(tmp_path):
    argv = ["agent", "--backend", "sim", "--state-dir", str(tmp_path), "--node-id", NODE]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "flexgate", *argv, "--port", str(free_port()), "--restore"],
        env=env | {"FLEXGATE_AGENT_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (
        0,
        f"{NODE}: nothing to restore (no GPU left capped)\n",
    )
