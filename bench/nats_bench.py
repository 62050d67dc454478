"""Benchmark: fan-out over HTTP against NATS, 1,000 and 10,000 nodes (bench/results/nats.json).

One run, one machine, the same agent farm (`bench/farm.py`: simulated nodes in several
processes, each serving its nodes over HTTP and over one NATS connection) and a `nats-server
-js` of its own, a fresh one per size. Per size:

- **gateway**: first, on the fresh farm, a `flexgate gateway` process over NATS with every node
  configured: its memory (RSS) once it knows them all and after the events, and event start
  (`POST /v1/events`, starting now) to every node at target, i.e. the last node's answer after
  reading back the caps of the gateway's own plan (its `acked_at`; cold: first commands), then
  a stricter overlapping event (re-planned); then, deep enough to cap every node (65% of the
  GPU power), stricter events (70%, 71%, 72%, 73%) whose commands are all **warm** (every node
  holds its originals already), the last with the 10,000-command plan read twice a second
  meanwhile.
- **fan-out**, the gateway's own clients (`HttpAgentClient`, `NatsAgentClient`) in this
  process: per-node caps from a real plan (`gateway.services.planner.plan` of a mix with one
  job per node; not one shared cap), all acked = every node read its new limits back. The first
  command to each node is **cold** (the agent saves its GPUs' originals to disk first); the
  same plan sent again with a new generation is **warm** (set and read back, no disk); then a
  new target (**re-plan**: newly capped nodes save originals, released ones forget theirs).
  Before each transport every node is restored (its originals forgotten), so both start cold.
- **CPU**: seconds of CPU per warm round of the farm, the broker and this process (the
  gateway's side), from /proc, against the round's wall time on this machine's cores.
- **load**: the machine's load average before and after each size (it is shared).

    python bench/nats_bench.py [--sizes 1000,10000] [--rounds 20,5] [--processes 4]
    python bench/nats_bench.py --sizes 10000 --site-loop   # the loop on: its fan-outs counted
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from farm import Farm, node_name
from gateway_bench import API_TOKEN, TOKEN, gateway_env, serve_gateway
from prometheus_client.parser import text_string_to_metric_families

from agents.protocol import CapCommand, GpuCap
from flexgate.serve import free_port
from flexmodel.jobmix import parse_job_mix
from gateway.agentclient import AgentClient, fan_out
from gateway.agentclient.http import HttpAgentClient
from gateway.agentclient.natsbus import NatsAgentClient, NatsOptions
from gateway.services.planner import plan
from gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NATS_TOKEN = "bench-nats-token-0123456789"
TICKS = os.sysconf("SC_CLK_TCK")


def start_nats(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{directory / "js"}" }}\n'
        f'authorization {{ token: "{NATS_TOKEN}" }}\n'
    )
    process = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nats-server did not start")


def one_job_per_node(nodes: int) -> dict[str, Any]:
    rng = np.random.default_rng(19)
    return {
        "jobs": [
            {
                "id": f"job-{i:05d}",
                "gpus": 8,
                "power_w": float(rng.uniform(500, 690)),
                "throughput": float(rng.uniform(1e4, 1e5)),
                "pfi": float(rng.uniform(1.1, 2.6)),
                "pfi_stderr": 0.1,
                "period_s": float(rng.uniform(1, 8)),
                "placement": [{"node": node_name(i), "gpus": list(range(8))}],
            }
            for i in range(nodes)
        ]
    }


def planned_caps(mix_doc: dict[str, Any], fraction: float) -> dict[str, list[GpuCap]]:
    """Per-node caps of the gateway's own plan for shedding `fraction` of the GPU power."""
    mix = parse_job_mix(mix_doc)
    baseline_kw = sum(j.gpus * j.power_w for j in mix.jobs) / 1000.0
    settings = GatewaySettings(lab=True, overhead_factor=1.0)
    names = {node_name(i) for i in range(len(mix.jobs))}
    doc = plan(mix, fraction * baseline_kw, names, settings)
    return {
        c["node"]: [GpuCap(gpu=x["gpu"], cap_w=x["cap_w"]) for x in c["caps"]]
        for c in doc["commands"]
    }


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Generations:
    """Above any the gateway process used before (its events run first, on a fresh farm)."""

    def __init__(self) -> None:
        self.value = 1_000_000

    def next(self) -> int:
        self.value += 1
        return self.value


async def rounds(
    client: AgentClient,
    addresses: list[str],
    plans: list[dict[str, list[GpuCap]]],
    count: int,
    generations: Generations,
    pids: dict[str, list[int]],
) -> dict[str, Any]:
    names = [node_name(i) for i in range(len(addresses))]
    failures: list[str] = []  #: after the retries (3, the gateway's default)

    async def send(caps: dict[str, list[GpuCap]]) -> tuple[float, list[float]]:
        generation = generations.next()
        targets = [
            (
                n,
                a,
                CapCommand(
                    plan_id=f"bench-{generation}",
                    generation=generation,
                    lease_s=600,
                    caps=caps.get(n, []),
                ),
            )
            for n, a in zip(names, addresses, strict=True)
        ]
        start = time.perf_counter()
        acks = await fan_out(client, targets)
        elapsed = time.perf_counter() - start
        failures.extend(a.error or "failed" for a in acks if a.failed)
        return elapsed, [a.delay_s for a in acks if a.delay_s is not None]

    await send({})  # every node restored, its originals forgotten: the next command is cold
    cold_s, _ = await send(plans[0])
    # Warm: the plan again, a new generation each round: every node sets and reads back its
    # caps, nothing goes to disk.
    totals, delays = [], []
    before = {k: cpu_s(v) for k, v in pids.items()} | {"gateway_side": own_cpu_s()}
    for _ in range(count):
        elapsed, node_delays = await send(plans[0])
        totals.append(elapsed)
        delays += node_delays
    after = {k: cpu_s(v) for k, v in pids.items()} | {"gateway_side": own_cpu_s()}
    wall = sum(totals)
    cores = os.cpu_count() or 1
    # A new target: nodes capped for the first time save their originals, nodes no longer
    # capped restore theirs and forget them (both written to disk).
    replan_s, _ = await send(plans[1])
    q = np.percentile
    return {
        "cold_all_acked_s": cold_s,
        "replan_all_acked_s": replan_s,
        "failed_commands": len(failures),
        "failures": sorted(set(failures))[:5],
        "warm_all_acked_p50_s": float(q(totals, 50)),
        "warm_all_acked_p99_s": float(q(totals, 99)),
        "warm_rounds": count,
        "node_delay_p50_s": float(q(delays, 50)),
        "node_delay_p99_s": float(q(delays, 99)),
        "cpu_s_per_warm_round": {k: (after[k] - before[k]) / count for k in after},
        "cpu_share_of_machine": {k: (after[k] - before[k]) / (wall * cores) for k in after},
    }


async def fan_outs(
    farm: Farm, nats_url: str, plans: list, count: int, generations: Generations, pids: dict
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [node_name(i) for i in range(farm.nodes)]
    nats_client = NatsAgentClient(
        NatsOptions(nats_url, token=NATS_TOKEN), TOKEN, timeout_s=60, retries=3, lease_s=600
    )
    await nats_client.connect()
    try:
        out["nats"] = await rounds(nats_client, names, plans, count, generations, pids)
    finally:
        await nats_client.close()
    print(f"  nats: {json.dumps(out['nats'])}", flush=True)
    http_client = HttpAgentClient(TOKEN, timeout_s=120, retries=3)
    try:
        out["http"] = await rounds(http_client, farm.urls, plans, count, generations, pids)
    finally:
        await http_client.close()
    print(f"  http: {json.dumps(out['http'])}", flush=True)
    for key in ("warm_all_acked_p50_s", "cold_all_acked_s"):
        out[f"http_over_nats_{key}"] = out["http"][key] / out["nats"][key]
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def event_to_acked(
    api: httpx.Client, reduction_kw: float, *, read_plan_meanwhile: bool = False
) -> dict[str, Any]:
    """POST an event starting now. At target: the last node's answer (it read its new limits
    back), on the gateway's clock (`acked_at`), less the moment the POST went out (the same
    machine's clock). Meanwhile this watches `/metrics` until a fan-out that started after
    the POST has finished, then reads the plan; with `read_plan_meanwhile`, it reads the
    event's plan (10,000 commands and answers) twice a second throughout instead, as an
    operator's page might: that read is a large one, and slows the gateway."""
    sent_before = metric(api, "flexgate_fan_outs_total")
    posted = datetime.now(UTC)
    start = time.perf_counter()
    body = {"reduction_kw": reduction_kw, "start": posted.isoformat(), "duration_s": 600}
    event = api.post("/v1/events", json=body).json()
    answered_s = time.perf_counter() - start
    while True:
        plan_id = api.get(f"/v1/events/{event['id']}").json()["plan_id"]
        finished = metric(api, "flexgate_fan_outs_finished_total") > sent_before
        if plan_id and (read_plan_meanwhile or finished):
            commands = api.get(f"/v1/plans/{plan_id}").json()["commands"]
            if all(c["status"] != "pending" for c in commands):
                break
            sent_before = metric(api, "flexgate_fan_outs_total") - 1  # another one: its end
        assert time.perf_counter() - start < 300, "the event's commands did not finish"
        time.sleep(0.5 if read_plan_meanwhile else 0.1)
    last = max(datetime.fromisoformat(c["acked_at"]) for c in commands if c["acked_at"])
    return {
        "at_target_s": (last - posted).total_seconds(),
        "post_answered_s": answered_s,
        "recorded_s": time.perf_counter() - start,
        "acked": sum(c["status"] == "acked" for c in commands),
        "capped": sum(bool(c["caps"]) for c in commands),
        "plan_read_meanwhile": read_plan_meanwhile,
        "errors": sorted({str(c["error"]) for c in commands if c["status"] != "acked"})[:5],
    }


def metric(api: httpx.Client, name: str) -> int:
    for family in text_string_to_metric_families(api.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return int(sample.value)
    raise RuntimeError(f"the gateway's /metrics has no {name}")


def gateway_event(
    tmp: Path, nats_url: str, mix_doc: dict, nodes: int, site_loop: bool = False
) -> dict[str, Any]:
    """A gateway process over NATS: RSS with every node known, event start -> all acked. With
    `site_loop`, the loop is on (closed on the estimate from the 5 s summaries), and the
    fan-outs of the two events' first two minutes are counted."""
    env = gateway_env(
        tmp / f"gateway-{nodes}.db",
        transport="nats",
        nats_url=nats_url,
        nats_token=NATS_TOKEN,
        agents=",".join(node_name(i) for i in range(nodes)),
        overhead_factor="1.0",
        reconcile_period_s="30",
        dispatch_timeout_s="30",
        # One plan per event unless the loop is asked for (`--site-loop`).
        tracking="true" if site_loop else "false",
    )
    gateway, url = serve_gateway(env)
    try:
        auth = {"Authorization": f"Bearer {API_TOKEN}"}
        with httpx.Client(base_url=url, timeout=120, headers=auth) as api:
            api.put("/v1/jobs", json=mix_doc).raise_for_status()
            started, known = time.monotonic(), 0
            while known < nodes:
                known = metric(api, "flexgate_agents_known")
                if time.monotonic() > started + 240:
                    return {"nodes": nodes, "known_after_240_s": known, "error": "not all found"}
                time.sleep(0.5)
            discovery_s = time.monotonic() - started
            rss = rss_mib(gateway.pid)
            baseline_kw = sum(j["gpus"] * j["power_w"] for j in mix_doc["jobs"]) / 1000.0
            fan_outs_before = metric(api, "flexgate_fan_outs_total")
            cold = event_to_acked(api, 0.15 * baseline_kw)
            again = event_to_acked(api, 0.25 * baseline_kw)  # stricter: wins, re-planned
            warm: dict[str, Any] | None = None
            if not site_loop:
                # Deep enough to cap every node (the ones capped for the first time save their
                # originals), then stricter and stricter: every node's command is warm.
                deep = event_to_acked(api, 0.65 * baseline_kw)
                runs = [event_to_acked(api, f * baseline_kw) for f in (0.70, 0.71, 0.72)]
                warm = {
                    "every_node_capped": deep,
                    "warm": runs,
                    "warm_at_target_p50_s": float(np.median([r["at_target_s"] for r in runs])),
                    "warm_plan_read_meanwhile": event_to_acked(
                        api, 0.73 * baseline_kw, read_plan_meanwhile=True
                    ),
                }
            loop: dict[str, Any] | None = None
            if site_loop:
                time.sleep(max(120.0 - (time.monotonic() - started - discovery_s), 0.0))
                loop = {
                    "fan_outs": metric(api, "flexgate_fan_outs_total") - fan_outs_before,
                    "over_s": time.monotonic() - started - discovery_s,
                    "tracking": api.get("/v1/site").json().get("tracking"),
                }
            return {
                "site_loop": loop,
                "nodes": nodes,
                "rss_mib_all_nodes_known": rss,
                "discovery_s": discovery_s,
                "rss_mib_after_events": rss_mib(gateway.pid),
                "first_event": cold,
                "second_event": again,
                "warm_events": warm,
            }
    finally:
        gateway.terminate()
        gateway.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--rounds", default="20,5", help="warm rounds per size")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--no-gateway", action="store_true", help="fan-out only (quicker)")
    parser.add_argument(
        "--site-loop",
        action="store_true",
        help="the gateway only, its site loop on (results/nats_site_loop.json)",
    )
    args = parser.parse_args()
    name = "nats_site_loop.json" if args.site_loop else "nats.json"
    tmp = Path(tempfile.mkdtemp(prefix="nats-bench-"))
    out: dict[str, Any] = {
        "benchmark": "nats",
        "cores": os.cpu_count(),
        "processes": args.processes,
        "python": sys.version.split()[0],
    }
    generations = Generations()
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(r) for r in args.rounds.split(",")]
    for nodes, count in zip(sizes, counts + counts[-1:] * len(sizes), strict=False):
        # A broker of its own per size: the bucket of the last size holds higher generations
        # for the nodes both share, which the new gateway's first commands would lose to (409).
        broker, nats_url = start_nats(tmp / f"nats-{nodes}")
        try:
            mix_doc = one_job_per_node(nodes)
            plans = [planned_caps(mix_doc, f) for f in (0.15, 0.25)]
            moved = sum(bool(plans[0].get(n)) != bool(plans[1].get(n)) for n in plans[1])
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXGATE_")} | {
                "FLEXGATE_AGENT_TOKEN": TOKEN,
                "FLEXGATE_AGENT_NATS_URL": nats_url,
                "FLEXGATE_AGENT_NATS_TOKEN": NATS_TOKEN,
            }
            mix_file = tmp / f"mix-{nodes}.json"
            mix_file.write_text(json.dumps(mix_doc))
            load_before = os.getloadavg()
            started = time.perf_counter()
            with Farm(nodes, args.processes, env, mix_path=str(mix_file)) as farm:
                print(f"{nodes} nodes up in {time.perf_counter() - started:.1f} s", flush=True)
                gateway = (
                    None
                    if args.no_gateway
                    else gateway_event(tmp, nats_url, mix_doc, nodes, args.site_loop)
                )
                print(f"  gateway: {json.dumps(gateway)}", flush=True)
                pids = {"farm": farm.pids, "broker": [broker.pid]}
                result = (
                    {}
                    if args.site_loop
                    else asyncio.run(fan_outs(farm, nats_url, plans, count, generations, pids))
                )
                result["gateway"] = gateway
                result["farm_rss_mib"] = sum(rss_mib(p) for p in farm.pids)
            # The machine is shared: its load average (`uptime`) before and after this size.
            result["load_average"] = {"before": load_before, "after": os.getloadavg()}
            result["capped_nodes"] = sum(bool(c) for c in plans[0].values())
            result["replan_nodes_to_or_from_disk"] = moved
            out[f"nodes_{nodes}"] = result
            RESULTS.mkdir(exist_ok=True)  # written after each size, so a later failure keeps it
            (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")
        finally:
            broker.terminate()
            broker.wait()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
