"""Benchmark: the agent (bench/results/agent.json).

- a cap command over HTTP on 8 simulated GPUs: round trip, and request-received to limit
  enforced per GPU (target p99 < 20 ms);
- telemetry sampling: CPU time per GPU per sample;
- one process hosting 1000 simulated nodes (no sampling): memory, and CPU at idle.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-token-0123456789"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cap_latency(state: Path, rounds: int = 300) -> dict[str, float]:
    node = AgentNode("bench", SimulatedBackend(8, node_id="bench"), state / "one", sample_hz=20)
    round_trip, enforced = [], []
    with ServerThread(create_app([node], TOKEN)) as url, httpx.Client(base_url=url) as client:
        for i in range(rounds):
            body = {
                "plan_id": "b",
                "generation": i,
                "lease_s": 60,
                "caps": [{"gpu": g, "cap_w": 300.0 + (i * 7 + g) % 400} for g in range(8)],
            }
            start = time.perf_counter()
            answer = client.put("/v1/caps", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            round_trip.append(time.perf_counter() - start)
            enforced += [r["elapsed_s"] for r in answer.json()["results"]]
    q = np.percentile
    return {
        "round_trip_p50_s": float(q(round_trip, 50)),
        "round_trip_p99_s": float(q(round_trip, 99)),
        "enforced_p50_s": float(q(enforced, 50)),
        "enforced_p99_s": float(q(enforced, 99)),
    }


def sampling_cost(state: Path, samples: int = 3000) -> float:
    node = AgentNode("s", SimulatedBackend(8, node_id="s"), state / "s", sample_hz=20)
    start = time.process_time()
    for _ in range(samples):
        node.sampler.sample_once()
    return (time.process_time() - start) / samples / 8


def many_nodes(state: Path, count: int = 1000) -> dict[str, float]:
    before = rss_mib()
    nodes = [
        AgentNode(
            f"n{i:04d}", SimulatedBackend(8, node_id=f"n{i:04d}"), state / f"n{i}", sample_hz=0
        )
        for i in range(count)
    ]
    with (
        ServerThread(create_app(nodes, TOKEN, prefixed=True)) as url,
        httpx.Client(base_url=url) as c,
    ):
        assert c.get("/nodes/n0999/health").status_code == 200
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(5.0)
        idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        memory = rss_mib() - before
    return {"nodes": count, "gpus_per_node": 8, "memory_mib": memory, "idle_cpu_share": idle}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        latency = cap_latency(state)
        print(
            f"cap command, 8 GPUs: round trip p50 {latency['round_trip_p50_s'] * 1e3:.2f} ms, "
            f"p99 {latency['round_trip_p99_s'] * 1e3:.2f} ms; enforced p50 "
            f"{latency['enforced_p50_s'] * 1e3:.3f} ms, "
            f"p99 {latency['enforced_p99_s'] * 1e3:.3f} ms",
            flush=True,
        )
        per_gpu = sampling_cost(state)
        print(
            f"sampling: {per_gpu * 1e6:.1f} us CPU per GPU per sample "
            f"({per_gpu * 20 * 100:.3f}% of a core per GPU at 20 Hz)",
            flush=True,
        )
        hosted = many_nodes(state)
        print(
            f"1000 nodes in one process: {hosted['memory_mib']:.0f} MiB, idle CPU "
            f"{hosted['idle_cpu_share'] * 100:.2f}% of a core",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "benchmark": "agent",
        "cap_command_8_gpus": latency,
        "sampling_cpu_s_per_gpu_sample": per_gpu,
        "many_nodes": hosted,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    (RESULTS / "agent.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
