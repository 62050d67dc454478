"""`flexgate lab`: the whole chain on loopback, and a report (docs/openadr.md, "The lab").

Simulated agents (N nodes of G GPUs in one process, under `/nodes/N`), a mock VTN (openleadr's
VTN) and the gateway with its VEN, each on a free loopback port, with SQLite in a temporary
folder. The job mix is drawn from the PFI study's job types. The VTN issues a LOAD_DISPATCH
delta of `reduction` times the site's GPU-attributable facility power; the lab shows site power
live and ends with a report and a PNG plot. Exit 0 when the site met the target within 5%.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.mockvtn import MockVtn
from flexgate.plots import plot_lab
from flexgate.serve import ServerThread, free_port
from flexmodel.jobmix import parse_job_mix
from flexmodel.workload import MAIN_TYPES, POWER_W
from gateway.app import create_app
from gateway.settings import LAB_API_TOKEN, GatewaySettings

TOLERANCE = 0.05
START_AFTER_S = 8.0
#: After the event the lab watches until site power is back at the baseline (within
#: TOLERANCE of the request) for this many samples in a row, or this long at most.
RECOVERED_SAMPLES = 4
RECOVERY_WAIT_S = 40.0
OVERHEAD_FACTOR = 1.3
AGENT_TOKEN = "lab-agent-token-0123"


def lab_jobs(nodes: int, gpus_per_node: int, seed: int = 7) -> list[dict[str, Any]]:
    """Jobs of the study's types filling every GPU: one job per node or per group of nodes."""
    rng = np.random.default_rng(seed)
    jobs, node = [], 0
    order = rng.permutation(len(MAIN_TYPES))
    while node < nodes:
        for t in (MAIN_TYPES[i] for i in order):
            span = max(t.gpus // gpus_per_node, 1)
            if node + span > nodes:
                continue
            low, high = POWER_W[(t.group, t.task)]
            jobs.append(
                {
                    "id": f"{t.name}-{len(jobs)}",
                    "gpus": span * gpus_per_node,
                    "power_w": round(float(rng.uniform(low, high)), 1),
                    "throughput": round(float(rng.uniform(2e3, 6e3)) * span * gpus_per_node, 1),
                    "pfi": t.pfi,
                    "pfi_stderr": 0.1,
                    "period_s": round(float(rng.uniform(1.5, 6.0)), 2),
                    "duty": round(float(rng.uniform(0.6, 0.85)), 2),
                    "placement": [
                        {"node": f"node-{node + k + 1:02d}", "gpus": list(range(gpus_per_node))}
                        for k in range(span)
                    ],
                }
            )
            node += span
            if node >= nodes:
                break
    return jobs


def run_lab(
    *,
    nodes: int = 4,
    gpus_per_node: int = 8,
    reduction: float = 0.25,
    duration_s: float = 40.0,
    out: Path = Path("out"),
    console: Console | None = None,
) -> int:
    console = console or Console()
    # openleadr's advice to VTN implementers (ven_lookup, report handlers) is not for lab users.
    logging.getLogger("openleadr").setLevel(logging.ERROR)
    jobs = lab_jobs(nodes, gpus_per_node)
    mix = parse_job_mix({"overhead_factor": OVERHEAD_FACTOR, "jobs": jobs})
    attributable = mix.overhead_factor * mix.baseline_gpu_kw
    requested = round(reduction * attributable, 1)
    tmp = Path(tempfile.mkdtemp(prefix="flexgate-lab-"))
    names = [f"node-{i + 1:02d}" for i in range(nodes)]
    agents = [
        AgentNode(n, SimulatedBackend(gpus_per_node, mix=mix, node_id=n), tmp / n, sample_hz=20)
        for n in names
    ]
    scenario = {
        "vtn_id": "LAB_VTN",
        "poll_s": 1,
        "events": [
            {
                "signal_name": "LOAD_DISPATCH",
                "signal_type": "delta",
                "start_offset_s": START_AFTER_S,
                "intervals": [{"duration_s": duration_s, "value": -requested}],
            }
        ],
    }
    vtn = MockVtn(scenario, port=free_port(), say=lambda line: console.print(f"[dim]{line}[/]"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)  # last: after every server
        agents_url = stack.enter_context(
            ServerThread(agent_app(agents, AGENT_TOKEN, prefixed=True))
        )
        stack.callback(vtn.stop)
        vtn.start()
        settings = GatewaySettings(
            database_url=f"sqlite:///{tmp / 'gateway.db'}",
            lab=True,
            agent_token=AGENT_TOKEN,
            overhead_factor=OVERHEAD_FACTOR,
            agents=",".join(f"{agents_url}/nodes/{n}" for n in names),
            lease_s=20.0,
            reconcile_period_s=2.0,
            recovery_ramp_s=4.0,
            recovery_steps=2,
            vtn_url=vtn.url,
            ven_name="flexgate-lab",
        )
        url = stack.enter_context(ServerThread(create_app(settings)))
        api = stack.enter_context(
            httpx.Client(
                base_url=url, timeout=20, headers={"Authorization": f"Bearer {LAB_API_TOKEN}"}
            )
        )
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
        console.print(
            f"lab: {nodes} nodes x {gpus_per_node} GPUs, {len(jobs)} jobs; the VTN asks "
            f"for {requested:.1f} kW ({reduction:.0%} of {attributable:.1f} kW) for "
            f"{duration_s:g} s"
        )
        trace = watch(api, vtn, duration_s, requested, console)
        return report(api, jobs, requested, trace, out, console)


def watch(
    api: httpx.Client, vtn: MockVtn, duration_s: float, requested: float, console: Console
) -> list[tuple[float, float, float, str]]:
    """Site power every half second until the event has ended and power is back at the
    baseline (the caps are all released): (t, kW, target, status)."""
    trace: list[tuple[float, float, float, str]] = []
    begin = time.monotonic()
    deadline = begin + START_AFTER_S + duration_s + RECOVERY_WAIT_S
    recovered = 0
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while time.monotonic() < deadline:
            site = api.get("/v1/site").json()
            events = api.get("/v1/events").json()["events"]
            status = events[0]["status"] if events else "waiting for the VTN"
            target = (
                site["baseline_facility_kw"] - requested
                if status == "active"
                else site["baseline_facility_kw"]
            )
            trace.append((time.monotonic() - begin, site["facility_power_kw"], target, status))
            table = Table(title="flexgate lab", show_header=False)
            table.add_row("event", status)
            table.add_row("site power", f"{site['facility_power_kw']:.1f} kW")
            table.add_row("target", f"{target:.1f} kW")
            table.add_row("shed now", f"{site['shed_facility_kw']:.1f} kW of {requested:.1f} kW")
            if events and events[0]["plan_id"] and status == "active":
                plan = api.get(f"/v1/plans/{events[0]['plan_id']}").json()
                for job in plan["jobs"]:
                    table.add_row(f"  {job['id']}", f"cap {job['cap_w']:.0f} W")
            live.update(table)
            back = abs(site["facility_power_kw"] - target) <= TOLERANCE * requested
            ended = status in ("completed", "cancelled", "opted_out", "failed")
            recovered = recovered + 1 if ended and back else 0
            if recovered >= RECOVERED_SAMPLES:
                break
            time.sleep(0.5)
    return trace


def report(
    api: httpx.Client,
    jobs: list[dict[str, Any]],
    requested: float,
    trace: list[tuple[float, float, float, str]],
    out: Path,
    console: Console,
) -> int:
    events = api.get("/v1/events").json()["events"]
    if not events:
        console.print("[red]the VTN's event never reached the gateway[/]")
        return 1
    event = events[0]
    active = [row for row in trace if row[3] == "active"]
    settled = active[len(active) // 2 :]  # the agents' 5 s telemetry window has filled
    # The target is the baseline less the request, so baseline - power = target + request - power.
    achieved = float(np.mean([t + requested - kw for _, kw, t, _ in settled])) if settled else 0.0
    ok = abs(achieved - requested) <= TOLERANCE * requested
    plan = api.get(f"/v1/plans/{event['plan_id']}").json() if event["plan_id"] else None
    table = Table(title="flexgate lab report", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", overflow="fold")  # an id is never cut short
    table.add_row("event", event["id"])
    table.add_row("status", f"{event['status']}, opted {event['opt']}")
    table.add_row("requested at the meter", f"{requested:.1f} kW")
    table.add_row(
        "achieved (settled mean)",
        f"{achieved:.1f} kW " + ("[green]within 5%[/]" if ok else "[red]outside 5%[/]"),
    )
    if plan:
        before = sum(j["throughput"] / j["throughput_fraction"] for j in plan["jobs"])
        after = sum(j["throughput"] for j in plan["jobs"])
        table.add_row("throughput kept, site", f"{after / before:.1%}")
        for j in plan["jobs"]:
            table.add_row(f"  {j['id']}", f"{j['throughput_fraction']:.1%} at {j['cap_w']:.0f} W")
    console.print(table)
    periods = {p["node"]: [] for j in jobs for p in j["placement"]}
    for j in jobs:
        for p in j["placement"]:
            periods[p["node"]].append(j["period_s"])
    loops = Table(title="control delay against T/2")
    for name in ("loop", "delay p99", "shortest T/2", "verdict"):
        loops.add_column(name, justify="right")
    for node in api.get("/v1/nodes").json()["nodes"]:
        delay = (node["actuation_delay"] or {}).get("p99_s")
        half = min(periods.get(node["node"], [float("nan")])) / 2
        loops.add_row(
            f"agent {node['node']}",
            "-" if delay is None else f"{delay * 1000:.2f} ms",
            f"{half:.2f} s",
            "-" if delay is None else ("below T/2" if delay < half else "[red]above T/2[/]"),
        )
    sync = api.get("/v1/sync").json()
    for loop in sync["loops"]:
        loops.add_row(
            loop["name"],
            f"{loop['delay_s']:.3g} s (window {loop['window_s']:.3g} s)",
            "-"
            if loop["shortest_half_period_s"] is None
            else f"{loop['shortest_half_period_s']:.2f} s",
            loop["verdict"],
        )
    console.print(loops)
    console.print(f"sync verdict: {sync['verdict']}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lab-site-power.png"
    plot_lab(trace, requested, path, overhead_factor=OVERHEAD_FACTOR)
    (out / "lab-report.json").write_text(
        json.dumps(
            {
                "requested_kw": requested,
                "achieved_kw": achieved,
                "met": ok,
                "event": event,
                "plan": plan,
                "sync": sync,
            },
            indent=2,
            default=str,
        )
    )
    console.print(f"plot: {path}")
    return 0 if ok else 1
