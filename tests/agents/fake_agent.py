"""An agent over the fake NVML whose driver state lives in a file (for crash tests).

python -m tests.agents.fake_agent PORT STATE_DIR DRIVER_FILE
"""

import sys
from pathlib import Path

import uvicorn

from agents.nvml import NvmlBackend
from agents.service import AgentNode, create_app
from tests.agents.fake_nvml import FakeNvml

TOKEN = "crash-test-token-0123"

if __name__ == "__main__":
    port, state_dir, driver = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    backend = NvmlBackend(nvml=FakeNvml(gpus=2, start_mw=650_000, state_file=driver))
    node = AgentNode("crash-node", backend, state_dir, sample_hz=10)
    uvicorn.run(create_app([node], TOKEN), host="127.0.0.1", port=port, log_level="warning")
