"""Benchmark: the gateway (bench/results/gateway.json).

- fan-out: one cap command to each of 1000 simulated nodes hosted by a separate agent process,
  all acks back (target p50 < 500 ms), with the per-node delay distribution;
- quotes: `POST /v1/quotes` on a 1000-job mix, 8 concurrent clients (this process) against the
  gateway (its own process), as a ratio to a bare FastAPI endpoint returning a payload of the
  same size, measured in the same run (target >= 0.8 on an unchanged mix); the cold quote too;
- event start -> every node acked its caps, 100 simulated nodes (target < 2 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from agents.protocol import CapCommand
from flexgate.serve import free_port
from gateway.agentclient import fan_out
from gateway.agentclient.http import HttpAgentClient

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TOKEN = "bench-agent-token-0123456789"
API_TOKEN = "bench-api-token-0123456789"


def serve(args: list[str], url: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{args} did not start")


def gateway_env(database: Path, **settings: str) -> dict[str, str]:
    """This process's environment without FLEXGATE_ variables, plus the bench's settings."""
    return (
        {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")}
        | {
            "FLEXGATE_DATABASE_URL": f"sqlite:///{database}",
            "FLEXGATE_API_TOKEN": API_TOKEN,
            "FLEXGATE_AGENT_TOKEN": TOKEN,
            "FLEXGATE_LOG_LEVEL": "warning",
            "FLEXGATE_READ_PUBLIC": "true",  # a bench on loopback
            "FLEXGATE_ALLOW_SIMULATED": "true",  # the farm's GPUs are simulated
        }
        | {f"FLEXGATE_{k.upper()}": v for k, v in settings.items()}
    )


def serve_gateway(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`flexgate gateway` on a free port with these settings: the process and its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return serve(["-m", "flexgate.cli", "gateway", "--port", str(port)], f"{url}/health", env), url


async def fan_out_rounds(base: str, nodes: int, rounds: int) -> dict[str, object]:
    totals, delays = [], []
    client = HttpAgentClient(TOKEN, timeout_s=30, retries=0)
    try:
        for generation in range(1, rounds + 1):
            targets = [
                (
                    f"n{i:04d}",
                    f"{base}/nodes/n{i:04d}",
                    CapCommand(
                        plan_id="bench",
                        generation=generation,
                        lease_s=60,
                        caps=[{"gpu": g, "cap_w": 400.0 + generation} for g in range(8)],
                    ),
                )
                for i in range(nodes)
            ]
            start = time.perf_counter()
            acks = await fan_out(client, targets)
            totals.append(time.perf_counter() - start)
            if generation > 1:  # the first round also opens the connections
                delays += [a.delay_s for a in acks if a.delay_s is not None]
            assert all(a.status == "acked" for a in acks), [a.error for a in acks if a.error][:3]
    finally:
        await client.close()
    q = np.percentile
    return {
        "nodes": nodes,
        "rounds": rounds,
        "first_round_s": totals[0],
        "p50_s": float(q(totals[1:], 50)),
        "p99_s": float(q(totals[1:], 99)),
        "node_delay_p50_s": float(q(delays, 50)),
        "node_delay_p99_s": float(q(delays, 99)),
        "node_delay_max_s": float(max(delays)),
    }


async def load(url: str, body: dict, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            while time.perf_counter() < stop:
                start = time.perf_counter()
                async with session.post(url, json=body) as answer:
                    await answer.read()
                    assert answer.status == 200
                latencies.append(time.perf_counter() - start)

        begin = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - begin
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_s": float(np.percentile(latencies, 50)),
        "p99_s": float(np.percentile(latencies, 99)),
    }


def big_mix(jobs: int, nodes: int) -> dict:
    rng = np.random.default_rng(5)
    return {
        "jobs": [
            {
                "id": f"job-{i}",
                "gpus": 8,
                "power_w": float(rng.uniform(500, 690)),
                "throughput": float(rng.uniform(1e4, 1e5)),
                "pfi": float(rng.uniform(1.1, 2.6)),
                "pfi_stderr": 0.1,
                "period_s": float(rng.uniform(1, 8)),
                "placement": [{"node": f"n{i % nodes:04d}", "gpus": list(range(8))}]
                if i < nodes
                else None,
            }
            for i in range(jobs)
        ]
    }


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    out: dict[str, object] = {"benchmark": "gateway"}
    farm_port = free_port()
    farm = serve(
        ["bench/servers.py", "farm", str(farm_port), "1000", TOKEN],
        f"http://127.0.0.1:{farm_port}/nodes/n0000/health",
    )
    try:
        out["fan_out_1000"] = asyncio.run(fan_out_rounds(f"http://127.0.0.1:{farm_port}", 1000, 12))
        print("fan-out 1000 nodes:", json.dumps(out["fan_out_1000"]), flush=True)
    finally:
        farm.terminate()
        farm.wait()

    # Quotes: the gateway with a 1000-job mix (no agents) against a bare endpoint.
    env = gateway_env(tmp / "quotes.db")
    gateway, url = serve_gateway(env)
    try:
        mix = big_mix(1000, 0)
        for job in mix["jobs"]:
            job.pop("placement")
        httpx.put(
            f"{url}/v1/jobs", json=mix, timeout=60, headers={"Authorization": f"Bearer {API_TOKEN}"}
        ).raise_for_status()
        body = {"reduction_kw": 100.0, "window_s": 3600}
        start = time.perf_counter()
        size = len(httpx.post(f"{url}/v1/quotes", json=body, timeout=60).content)
        cold = time.perf_counter() - start
        gateway_load = asyncio.run(load(f"{url}/v1/quotes", body, 8, 8.0))
    finally:
        gateway.terminate()
        gateway.wait()
    bare_port = free_port()
    bare = serve(
        ["bench/servers.py", "bare", str(bare_port), str(size)],
        f"http://127.0.0.1:{bare_port}/docs",
    )
    try:
        bare_load = asyncio.run(load(f"http://127.0.0.1:{bare_port}/v1/quotes", body, 8, 8.0))
    finally:
        bare.terminate()
        bare.wait()
    out["quotes_1000_jobs"] = {
        "payload_bytes": size,
        "cold_s": cold,
        "gateway": gateway_load,
        "bare": bare_load,
        "ratio": gateway_load["requests_per_s"] / bare_load["requests_per_s"],
    }
    print("quotes:", json.dumps(out["quotes_1000_jobs"]), flush=True)

    # Event start -> every node acked, 100 nodes.
    nodes = 100
    mix_file = tmp / "mix.json"
    mix = big_mix(nodes, nodes)
    mix_file.write_text(json.dumps(mix))
    farm_port = free_port()
    farm = serve(
        ["bench/servers.py", "farm", str(farm_port), str(nodes), TOKEN, str(mix_file)],
        f"http://127.0.0.1:{farm_port}/nodes/n0000/health",
    )
    env |= {
        "FLEXGATE_DATABASE_URL": f"sqlite:///{tmp / 'event.db'}",
        "FLEXGATE_AGENTS": ",".join(
            f"http://127.0.0.1:{farm_port}/nodes/n{i:04d}" for i in range(nodes)
        ),
    }
    gateway, url = serve_gateway(env)
    try:
        auth = {"Authorization": f"Bearer {API_TOKEN}"}
        with httpx.Client(base_url=url, timeout=60, headers=auth) as api:
            api.put("/v1/jobs", json=mix).raise_for_status()
            start = time.perf_counter()
            event = api.post(
                "/v1/events",
                json={
                    "reduction_kw": 100.0,
                    "start": datetime.now(UTC).isoformat(),
                    "duration_s": 600,
                },
            ).json()
            while True:
                plan_id = api.get(f"/v1/events/{event['id']}").json()["plan_id"]
                if plan_id and all(
                    c["status"] == "acked"
                    for c in api.get(f"/v1/plans/{plan_id}").json()["commands"]
                ):
                    break
                time.sleep(0.01)
            out["event_to_target_100_nodes_s"] = time.perf_counter() - start
            print(f"event start -> all 100 nodes acked: {out['event_to_target_100_nodes_s']:.3f} s")
    finally:
        gateway.terminate()
        farm.terminate()
        gateway.wait()
        farm.wait()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gateway.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
