"""An agent farm: many simulated nodes across several processes, over HTTP and NATS at once.

    python bench/farm.py --nodes 10000 --processes 4 --nats-url nats://127.0.0.1:4222

Each process hosts `nodes / processes` simulated 8-GPU nodes (`n00000`, `n00001` ...): their
HTTP API under `http://127.0.0.1:PORT/nodes/<node>` (one port per process, printed) and, with a
NATS URL, one NATS connection serving all of them (`agents.natslink.NatsLink`). Nodes sample
nothing (`sample_hz=0`: their summaries carry each GPU's power now) and keep a short telemetry
window, so 10,000 nodes fit in a few hundred MiB. The agent token is FLEXGATE_AGENT_TOKEN, the
NATS credentials FLEXGATE_AGENT_NATS_TOKEN (or _USER/_PASSWORD), as for `flexgate agent`.
`Farm` starts and stops one from Python (the benchmarks).

`--gpus h200` gives the simulated GPUs an H200's way of holding a limit and its power sensor
(`agents.enforcement.H200`, `flexmodel.sensors.SENSORS["H200"]`, each node's sensor updating
at its own moments); `ideal` (the default) what the simulation always had. Each process then
answers `GET /farm/power?start=&step=&count=`: its nodes' GPU power summed at those monotonic
times, as the sensors read it and as the controllers hold it (`SimulatedBackend.site_power`),
for the fast path's benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import uvicorn

from agents.enforcement import ENFORCEMENTS
from agents.fasttrigger import TriggerGuard
from agents.natsconnect import NatsOptions
from agents.natslink import NatsLink
from agents.service import AgentNode, create_app
from agents.simulated import SimulatedBackend
from flexgate.serve import free_port
from flexmodel.jobmix import parse_job_mix_json
from flexmodel.jobs import JobMix
from flexmodel.sensors import SENSORS

ROOT = Path(__file__).resolve().parent.parent


def node_name(index: int) -> str:
    return f"n{index:05d}"


def node_mixes(mix: JobMix | None) -> dict[str, JobMix]:
    """Each node's own jobs, as a mix of their own (a node reads only its jobs, not the
    site's thousands)."""
    placed: dict[str, list] = {}
    for job in mix.jobs if mix else ():
        for node in {where.node for where in job.placement or ()}:
            placed.setdefault(node, []).append(job)
    return {node: JobMix(jobs=tuple(jobs)) for node, jobs in placed.items()}


def simulated(index: int, mixes: dict[str, JobMix], gpus: str) -> SimulatedBackend:
    """Node `index`'s GPUs; `gpus`: "ideal" or "h200" (the module's doc)."""
    name = node_name(index)
    if gpus == "ideal":
        return SimulatedBackend(8, mix=mixes.get(name), node_id=name, noise_w=0.0)
    sensor = SENSORS["H200"]
    return SimulatedBackend(
        8,
        mix=mixes.get(name),
        node_id=name,
        noise_w=0.0,
        sensor=sensor,
        sensor_offset_s=sensor.update_s * ((index * 0.618034) % 1.0),
        enforcement=ENFORCEMENTS[gpus],
    )


def worker(
    first: int, count: int, port: int, mix_path: str | None, period_s: float, gpus: str = "ideal"
) -> None:
    """One farm process: nodes `first` .. `first + count - 1` (runs until SIGTERM)."""
    token = os.environ["FLEXGATE_AGENT_TOKEN"]
    mix = (
        parse_job_mix_json(Path(mix_path).read_text(encoding="utf-8"), source=mix_path)
        if mix_path
        else None
    )
    mixes = node_mixes(mix)
    state = Path(tempfile.mkdtemp(prefix="farm-"))
    nodes = [
        AgentNode(
            node_name(i), simulated(i, mixes, gpus), state / node_name(i), sample_hz=0, window_s=1.6
        )
        for i in range(first, first + count)
    ]
    links = []
    # The fast path's triggers, checked once per process (bench/fast_bench.py).
    max_age_s = float(os.environ.get("FLEXGATE_AGENT_FAST_MAX_AGE_S", "2"))
    fast = TriggerGuard(os.environ.get("FLEXGATE_AGENT_FAST_SECRET"), max_age_s)
    url = os.environ.get("FLEXGATE_AGENT_NATS_URL")
    if url:
        options = NatsOptions(
            url,
            token=os.environ.get("FLEXGATE_AGENT_NATS_TOKEN"),
            user=os.environ.get("FLEXGATE_AGENT_NATS_USER"),
            password=os.environ.get("FLEXGATE_AGENT_NATS_PASSWORD"),
        )
        links.append(NatsLink(nodes, options, token, telemetry_period_s=period_s, fast=fast))
    app = create_app(nodes, token, prefixed=True, lease_check_s=1.0, links=links, fast=fast)

    @app.get("/farm/power")
    def power(start: float, step: float, count: int) -> dict[str, list[float]]:
        """The nodes' GPU power summed at `start + k * step` (k < count), monotonic [W]."""
        times = start + step * np.arange(count)
        sensed, average = np.zeros(count), np.zeros(count)
        for node in nodes:
            assert isinstance(node.backend, SimulatedBackend)
            node_sensed, node_average = node.backend.site_power(times)
            sensed += node_sensed
            average += node_average
        return {"sensed_w": sensed.tolist(), "average_w": average.tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Farm:
    """`with Farm(nodes, processes, env) as farm:` the processes, ready; `farm.urls[i]` is
    node i's HTTP base URL, `farm.pids` the processes (for their CPU time)."""

    def __init__(
        self,
        nodes: int,
        processes: int,
        env: dict[str, str],
        *,
        mix_path: str | None = None,
        telemetry_period_s: float = 5.0,
        gpus: str = "ideal",
    ) -> None:
        if gpus not in ENFORCEMENTS:
            raise ValueError(f"gpus must be one of {sorted(ENFORCEMENTS)}, got {gpus!r}")
        self.nodes, self.env, self.gpus = nodes, env, gpus
        share = -(-nodes // processes)
        self.slices = [(p * share, min(share, nodes - p * share)) for p in range(processes)]
        self.slices = [(first, count) for first, count in self.slices if count > 0]
        self.ports = [free_port() for _ in self.slices]
        self.mix_path, self.period_s = mix_path, telemetry_period_s
        self.processes: list[subprocess.Popen[bytes]] = []
        self.power_urls = [f"http://127.0.0.1:{port}/farm/power" for port in self.ports]
        self.urls = [
            f"http://127.0.0.1:{port}/nodes/{node_name(i)}"
            for (first, count), port in zip(self.slices, self.ports, strict=True)
            for i in range(first, first + count)
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def __enter__(self) -> Farm:
        for (first, count), port in zip(self.slices, self.ports, strict=True):
            args = [sys.executable, __file__, "worker", str(first), str(count), str(port)]
            args += ["--period-s", str(self.period_s), "--gpus", self.gpus]
            if self.mix_path:
                args += ["--mix", self.mix_path]
            self.processes.append(subprocess.Popen(args, cwd=ROOT, env=self.env))
        deadline = time.monotonic() + 300
        for (first, count), port in zip(self.slices, self.ports, strict=True):
            last = f"http://127.0.0.1:{port}/nodes/{node_name(first + count - 1)}/health"
            while True:
                try:
                    if httpx.get(last, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                    self.__exit__()
                    raise RuntimeError("the farm did not start")
                time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", default="farm", choices=["farm", "worker"])
    parser.add_argument("first", nargs="?", type=int, default=0)
    parser.add_argument("count", nargs="?", type=int, default=0)
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--mix", default=None, help="a job-mix file placing jobs on the nodes")
    parser.add_argument("--period-s", type=float, default=5.0, help="telemetry period [s]")
    parser.add_argument("--nats-url", default=None)
    parser.add_argument(
        "--gpus", default="ideal", choices=sorted(ENFORCEMENTS), help="how they hold a limit"
    )
    args = parser.parse_args()
    if args.kind == "worker":
        worker(args.first, args.count, args.port, args.mix, args.period_s, args.gpus)
        return
    env = dict(os.environ)
    if args.nats_url:
        env["FLEXGATE_AGENT_NATS_URL"] = args.nats_url
    with Farm(
        args.nodes,
        args.processes,
        env,
        mix_path=args.mix,
        telemetry_period_s=args.period_s,
        gpus=args.gpus,
    ):
        print(f"{args.nodes} nodes in {args.processes} processes; Ctrl-C stops them", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(asyncio.sleep(10**9))


if __name__ == "__main__":
    main()
