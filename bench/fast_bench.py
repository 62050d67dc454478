"""Benchmark: the fast path, trigger to every node at its armed caps (bench/results/fast.json).

Per size (1,000 and 10,000 simulated 8-GPU nodes, one job each), on this machine: a fresh
`nats-server -js`, the agent farm (`bench/farm.py`, several processes, each checking a trigger
once and applying it on all its nodes) and a `flexgate gateway` process over NATS with
FLEXGATE_FAST_DEPTHS=10,20,30,40.

- **armed**: from the job mix put to every node holding its plans (`/v1/fast/armed`); then the
  gateway's and the farm's CPU and memory (RSS) over a quiet minute of keeping them armed
  (the gateway checks them every FLEXGATE_FAST_REARM_S; nothing moved, nothing sent).
- **trigger to enforced**, counted from the trigger: `POST /v1/fast/trigger` (the API: the
  gateway signs and publishes) or a signed message published straight on the subject (a
  trigger source on the broker, such as a relay); done when every farm process has reported
  its nodes' caps read back (`flexgate.fast.fired`). The first trigger is cold (every node
  saves its originals to disk first); then warm ones at 30% (each kind in turn) and ones
  moving between 20% and 30%; p50/p99 over the triggers of each kind.
- **the ordinary path**, in the same run for comparison: three events (30%, 31%, 32%), event
  start to every node's answer (docs/benchmarks.md's other figures come from other runs).

    python bench/fast_bench.py [--sizes 1000,10000] [--triggers 20] [--processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nats
import numpy as np
from farm import Farm, node_name
from gateway_bench import API_TOKEN, TOKEN, gateway_env, serve_gateway
from nats_bench import (
    NATS_TOKEN,
    cpu_s,
    event_to_acked,
    metric,
    one_job_per_node,
    rss_mib,
    start_nats,
)

from agents.protocol_fast import FAST_FIRED_SUBJECT, FAST_TRIGGER_SUBJECT, FastFired, FastTrigger

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SECRET = "bench-fast-secret-0123456789"
MAX_AGE_S = 30.0


class Reports:
    """Every farm process's `FastFired`, by trigger sequence: when the nodes were all in
    (those armed at the depth at their caps, the others unchanged)."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.reported: dict[int, int] = {}
        self.applied: dict[int, int] = {}
        self.done_at: dict[int, float] = {}
        self.elapsed: dict[int, list[float]] = {}

    async def heard(self, msg: Any) -> None:
        fired = FastFired.model_validate_json(msg.data)
        self.reported[fired.seq] = self.reported.get(fired.seq, 0) + fired.nodes
        self.applied[fired.seq] = self.applied.get(fired.seq, 0) + fired.applied
        self.elapsed.setdefault(fired.seq, []).append(fired.elapsed_s)
        if self.reported[fired.seq] >= self.nodes:
            self.done_at[fired.seq] = time.perf_counter()

    async def wait(self, seq: int, timeout_s: float = 30.0) -> float:
        deadline = time.perf_counter() + timeout_s
        while seq not in self.done_at:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"trigger {seq}: {self.reported.get(seq, 0)} nodes reported")
            await asyncio.sleep(0.001)
        return self.done_at[seq]


def signed(seq: int, depth_pct: float) -> tuple[bytes, str]:
    body = FastTrigger(
        seq=seq, sent_at_s=time.time(), depth_pct=depth_pct, duration_s=60.0
    ).model_dump_json()
    return body.encode(), hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()


class Triggers:
    """Triggers sent two ways, each timed to the last farm process's report."""

    def __init__(self, url: str, nc: Any, reports: Reports) -> None:
        self.nc, self.reports = nc, reports
        self.api = httpx.AsyncClient(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
        self.applied: list[int] = []  #: per trigger, the nodes now at their caps
        self.process_s: list[float] = []  #: per process and trigger, its nodes' apply time

    async def by_api(self, depth: float) -> float:
        start = time.perf_counter()
        answer = await self.api.post(
            "/v1/fast/trigger", json={"depth_pct": depth, "duration_s": 60}
        )
        answer.raise_for_status()
        return await self._done(answer.json()["seq"], start)

    async def by_broadcast(self, depth: float) -> float:
        seq = int(time.time() * 1_000_000)
        body, sig = signed(seq, depth)
        start = time.perf_counter()
        await self.nc.publish(FAST_TRIGGER_SUBJECT, body, headers={"Flexgate-Signature": sig})
        await self.nc.flush()
        return await self._done(seq, start)

    async def _done(self, seq: int, start: float) -> float:
        done = await self.reports.wait(seq, timeout_s=120.0)
        self.applied.append(self.reports.applied[seq])
        self.process_s += self.reports.elapsed[seq]
        await asyncio.sleep(0.2)
        return done - start


def percentiles(values: list[float]) -> dict[str, float]:
    q = np.percentile
    return {"p50_s": float(q(values, 50)), "p99_s": float(q(values, 99)), "max_s": max(values)}


async def triggers(url: str, nats_url: str, nodes: int, count: int) -> dict[str, Any]:
    """Cold (every armed node saves its GPUs' originals, fsync, before its first change),
    then warm at 30% (API and broadcast in turn: every armed node sets and reads back its
    caps), then moving between 20% and 30% (nodes released and capped again: disk both ways)."""
    reports = Reports(nodes)
    nc = await nats.connect(nats_url, token=NATS_TOKEN)
    await nc.subscribe(FAST_FIRED_SUBJECT, cb=reports.heard)
    run = Triggers(url, nc, reports)
    try:
        cold = await run.by_api(30.0)
        warm: dict[str, list[float]] = {"api": [], "broadcast": []}
        for _ in range(count):
            warm["api"].append(await run.by_api(30.0))
            warm["broadcast"].append(await run.by_broadcast(30.0))
        moving = [await run.by_broadcast(20.0 if k % 2 == 0 else 30.0) for k in range(count)]
    finally:
        await run.api.aclose()
        await nc.close()
    return {
        "triggers_each": count,
        "farm_max_age_s": MAX_AGE_S,
        "nodes_capped_at_30_20": [run.applied[0], run.applied[-2]],
        "cold_api_to_enforced_s": cold,
        "warm_api_to_enforced": percentiles(warm["api"]),
        "warm_broadcast_to_enforced": percentiles(warm["broadcast"]),
        "moving_broadcast_to_enforced": percentiles(moving),
        "farm_process_apply": percentiles(run.process_s),
    }


def settled(api: httpx.Client) -> bool:
    doc = api.get("/v1/fast/armed").json()
    return bool(doc["settled"] and doc["generation"] > 0)


def keep_armed(
    api: httpx.Client, gateway_pid: int, farm: Farm, nodes: int, quiet_s: float
) -> dict[str, Any]:
    """Put the mix, wait for every node armed, then a quiet minute's CPU and memory."""
    mix_doc = one_job_per_node(nodes)
    start = time.monotonic()
    api.put("/v1/jobs", json=mix_doc).raise_for_status()
    while not settled(api):
        if time.monotonic() - start > 300:
            raise RuntimeError("the plans were not armed within 300 s")
        time.sleep(0.1)
    armed_s = time.monotonic() - start
    doc = api.get("/v1/fast/armed").json()
    sent = doc["nodes_sent"]
    before = (cpu_s([gateway_pid]), cpu_s(farm.pids), time.monotonic())
    time.sleep(quiet_s)
    after = (cpu_s([gateway_pid]), cpu_s(farm.pids), time.monotonic())
    wall = after[2] - before[2]
    farm_rss = [rss_mib(p) for p in farm.pids]
    return {
        "mix_put_to_all_armed_s": armed_s,
        "armed_states_sent": sent,
        "armed_nodes_per_depth": doc["armed_nodes"],
        "sent_again_while_quiet": api.get("/v1/fast/armed").json()["nodes_sent"] - sent,
        "gateway_rss_mib": rss_mib(gateway_pid),
        "gateway_cpu_share_of_a_core_quiet": (after[0] - before[0]) / wall,
        "farm_rss_mib_per_node": sum(farm_rss) / nodes,
        "farm_cpu_share_of_a_core_per_1000_nodes_quiet": (after[1] - before[1])
        / wall
        / (nodes / 1000),
    }


def ordinary_events(api: httpx.Client, nodes: int) -> list[float]:
    """The same site's ordinary path in the same run, for comparison: events of 30%, 31% and
    32% of the GPU power, each from `POST /v1/events` to every node's answer (planned, stored
    and fanned out; the nodes are warm by then, their originals saved)."""
    baseline_kw = sum(j["gpus"] * j["power_w"] for j in one_job_per_node(nodes)["jobs"]) / 1000
    return [event_to_acked(api, f * baseline_kw)["at_target_s"] for f in (0.30, 0.31, 0.32)]


def one_size(tmp: Path, nodes: int, processes: int, count: int, quiet_s: float) -> dict[str, Any]:
    nats_server, nats_url = start_nats(tmp / f"nats-{nodes}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
        "FLEXGATE_AGENT_TOKEN": TOKEN,
        "FLEXGATE_AGENT_NATS_URL": nats_url,
        "FLEXGATE_AGENT_NATS_TOKEN": NATS_TOKEN,
        "FLEXGATE_AGENT_FAST_SECRET": SECRET,
        # A farm process's thousands of nodes, on a shared machine, may queue a trigger for
        # longer than the default 2 s; the bench measures the delay, not the refusal.
        "FLEXGATE_AGENT_FAST_MAX_AGE_S": str(MAX_AGE_S),
    }
    try:
        with Farm(nodes, processes, env, telemetry_period_s=30.0) as farm:
            gateway, url = serve_gateway(
                gateway_env(
                    tmp / f"gateway-{nodes}.db",
                    transport="nats",
                    nats_url=nats_url,
                    nats_token=NATS_TOKEN,
                    agents=",".join(node_name(i) for i in range(nodes)),
                    overhead_factor="1.0",
                    tracking="false",
                    dispatch_timeout_s="30",
                    fast_depths="10,20,30,40",
                    fast_secret=SECRET,
                    fast_rearm_s="10",
                )
            )
            try:
                with httpx.Client(
                    base_url=url, timeout=120, headers={"Authorization": f"Bearer {API_TOKEN}"}
                ) as api:
                    while metric(api, "flexgate_agents_known") < nodes:
                        time.sleep(0.5)
                    armed = keep_armed(api, gateway.pid, farm, nodes, quiet_s)
                    fired = asyncio.run(triggers(url, nats_url, nodes, count))
                    fired["ordinary_event_at_target_s"] = ordinary_events(api, nodes)
            finally:
                gateway.terminate()
                gateway.wait(60)
    finally:
        nats_server.terminate()
        nats_server.wait(10)
    return {"nodes": nodes, "farm_processes": processes, **armed, **fired}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--triggers", type=int, default=20)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quiet-s", type=float, default=60.0, help="CPU measured over [s]")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in (int(s) for s in args.sizes.split(",")):
            load = os.getloadavg()[0]
            result = one_size(Path(tmp), nodes, args.processes, args.triggers, args.quiet_s)
            result["load_before"], result["load_after"] = load, os.getloadavg()[0]
            print(json.dumps(result), flush=True)
            results.append(result)
    doc = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "targets": {"p99_at_1000_s": 0.1, "p99_at_10000_s": 0.5},
        "sizes": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fast.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
