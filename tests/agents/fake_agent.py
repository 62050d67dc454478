"""An agent over the fake NVML whose driver state lives in a file (for crash tests).

python -m tests.agents.fake_agent PORT STATE_DIR DRIVER_FILE [NODE_ID]

`start_agent` runs it as a child process, so a test can SIGKILL it.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import uvicorn

from tests.conftest import ROOT

TOKEN = "crash-test-token-0123"
ORIGINAL_MW = 650_000


def start_agent(port: int, state_dir: Path, driver: Path, node_id: str = "crash-node"):
    """The agent in a child process, once it answers /health."""
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
                node_id,
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


def driver_limits(driver: Path) -> list[int]:
    """Each fake GPU's enforced limit [mW], as the driver holds it."""
    return json.loads(driver.read_text())["limits_mw"]


if __name__ == "__main__":
    from agents.nvml import NvmlBackend
    from agents.service import AgentNode, create_app
    from tests.agents.fake_nvml import FakeNvml

    port, state_dir, driver = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    node_id = sys.argv[4] if len(sys.argv) > 4 else "crash-node"
    backend = NvmlBackend(nvml=FakeNvml(gpus=2, start_mw=ORIGINAL_MW, state_file=driver))
    node = AgentNode(node_id, backend, state_dir, sample_hz=10)
    uvicorn.run(create_app([node], TOKEN), host="127.0.0.1", port=port, log_level="warning")
