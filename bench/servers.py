"""Servers the gateway benchmark runs as separate processes.

python bench/servers.py farm PORT NODES TOKEN [JOB_MIX]   # simulated nodes under /nodes/N
python bench/servers.py bare PORT BYTES                    # a bare endpoint, fixed payload
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Response

from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix_json


def farm(port: int, count: int, token: str, mix_path: str | None) -> None:
    mix = (
        parse_job_mix_json(Path(mix_path).read_text(encoding="utf-8"), source=mix_path)
        if mix_path
        else None
    )
    state = Path(tempfile.mkdtemp(prefix="farm-"))
    nodes = [
        AgentNode(
            f"n{i:04d}",
            SimulatedBackend(8, mix=mix, node_id=f"n{i:04d}", noise_w=0.0),
            state / f"n{i}",
            sample_hz=0,
        )
        for i in range(count)
    ]
    uvicorn.run(
        create_app(nodes, token, prefixed=True, lease_check_s=1.0),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )


def bare(port: int, size: int) -> None:
    payload = json.dumps({"data": "x" * max(size - 12, 0)}).encode()
    app = FastAPI()

    @app.post("/v1/quotes")
    async def quotes() -> Response:
        return Response(content=payload, media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "farm":
        farm(port, int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        bare(port, int(sys.argv[3]))
