"""`flexgate lab`: the whole chain on loopback, and a report (docs/cli.md).

Simulated agents (N nodes of G GPUs in one process, under `/nodes/N`), a lab facility meter
(`flexgate.labmeter`: the agents' true GPU power through a static load, an overhead factor, a
cooling lag and noise), a mock VTN (openleadr's VTN) and the gateway with its VEN, each on a
free loopback port, with SQLite in a temporary folder. The job mix is drawn from the PFI
study's job types. The VTN issues a LOAD_DISPATCH delta of `reduction` times the site's
GPU-attributable facility power; the lab shows site power live and ends with a report and a
PNG plot. What was delivered is read at the meter: its mean before the event less its mean
over the settled part of the event.

With `mismatch`, the agents run a truth drawn away from the declared mix and the meter a
different overhead factor and a static load (`flexgate.simsite.draw_truth`), and the lab runs
the event twice, open loop (the model's plan alone) and closed loop (the site loop at the
meter). Exit 0 when the (closed-loop) site met the target within 5%.
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
from flexgate import labmeter
from flexgate.mockvtn import MockVtn
from flexgate.plots import plot_lab
from flexgate.serve import ServerThread, free_port
from flexgate.simsite import Truth, draw_truth
from flexmodel.jobmix import parse_job_mix
from flexmodel.workload import MAIN_TYPES, POWER_W
from gateway.app import create_app
from gateway.settings import LAB_API_TOKEN, GatewaySettings

TOLERANCE = 0.05
#: The event starts this long after the lab: the meter's window fills first [s]
START_AFTER_S = 18.0
#: After the event the lab watches until site power is back at the baseline (within
#: TOLERANCE of the request) for this many samples in a row, or this long at most [s].
RECOVERED_SAMPLES = 4
RECOVERY_WAIT_S = 40.0
OVERHEAD_FACTOR = 1.3
#: The mismatched truth's static load (the declared site has none) [kW]
STATIC_KW = 5.0
METER_PERIOD_S = 0.5
METER_TIME_CONSTANT_S = 1.0
METER_NOISE_KW = 0.05
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
                    "period_s": round(float(rng.uniform(0.8, 2.5)), 2),
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
    mismatch: bool = False,
    seed: int = 7,
    console: Console | None = None,
) -> int:
    console = console or Console()
    # openleadr's advice to VTN implementers (ven_lookup, report handlers) is not for lab users.
    logging.getLogger("openleadr").setLevel(logging.ERROR)
    jobs = lab_jobs(nodes, gpus_per_node, seed)
    mix = parse_job_mix({"overhead_factor": OVERHEAD_FACTOR, "jobs": jobs})
    attributable = mix.overhead_factor * mix.baseline_gpu_kw
    requested = round(reduction * attributable, 1)
    truth = (
        draw_truth(
            jobs,
            overhead_factor=OVERHEAD_FACTOR,
            static_kw=STATIC_KW,
            rng=np.random.default_rng(seed),
        )
        if mismatch
        else Truth(jobs, OVERHEAD_FACTOR, 0.0)
    )
    tmp = Path(tempfile.mkdtemp(prefix="flexgate-lab-"))
    names = [f"node-{i + 1:02d}" for i in range(nodes)]
    true_mix = parse_job_mix({"jobs": truth.jobs})
    agents = [
        AgentNode(
            n, SimulatedBackend(gpus_per_node, mix=true_mix, node_id=n), tmp / n, sample_hz=20
        )
        for n in names
    ]
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)  # last: after every server
        agents_url = stack.enter_context(
            ServerThread(agent_app(agents, AGENT_TOKEN, prefixed=True))
        )
        agent_urls = [f"{agents_url}/nodes/{n}" for n in names]
        meter = labmeter.LabMeter(
            agent_urls,
            static_kw=truth.static_kw,
            overhead_factor=truth.overhead_factor,
            noise_kw=METER_NOISE_KW,
            time_constant_s=METER_TIME_CONSTANT_S,
            period_s=METER_PERIOD_S / 2,
            seed=seed,
        )
        meter_url = stack.enter_context(ServerThread(labmeter.create_app(meter)))
        console.print(
            f"lab: {nodes} nodes x {gpus_per_node} GPUs, {len(jobs)} jobs; the VTN asks "
            f"for {requested:.1f} kW ({reduction:.0%} of {attributable:.1f} kW) for "
            f"{duration_s:g} s"
        )
        if mismatch:
            console.print(
                f"mismatch: the truth's overhead factor {truth.overhead_factor:g} (declared "
                f"{OVERHEAD_FACTOR:g}), static load {truth.static_kw:g} kW (declared 0), "
                + ", ".join(
                    f"{d['id']}: {t['power_w']:g} W (declared {d['power_w']:g}), "
                    f"duty {t['duty']:g} ({d['duty']:g})"
                    for d, t in zip(jobs, truth.jobs, strict=True)
                )
            )
        passes = [("open loop", False), ("closed loop", True)] if mismatch else [("", True)]
        results = []
        for name, tracking in passes:
            if name:
                console.print(f"[bold]{name}[/]")
            results.append(
                run_event(
                    tmp / "gateway",  # one store: the generation goes on rising
                    agent_urls,
                    f"{meter_url}/meter",
                    jobs,
                    requested,
                    duration_s,
                    tracking,
                    console,
                    frozenset(r["event"]["id"] for r in results if r["event"]),
                )
            )
        return report(results, jobs, requested, out, console)


def run_event(
    folder: Path,
    agent_urls: list[str],
    meter_url: str,
    jobs: list[dict[str, Any]],
    requested: float,
    duration_s: float,
    tracking: bool,
    console: Console,
    earlier: frozenset[str],
) -> dict[str, Any]:
    """One event from the mock VTN through a fresh gateway on the lab's store (`earlier`: the
    events of the runs before): the trace and what it read."""
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
        stack.callback(vtn.stop)
        vtn.start()
        settings = GatewaySettings(
            database_url=f"sqlite:///{folder / 'gateway.db'}",
            lab=True,
            agent_token=AGENT_TOKEN,
            overhead_factor=OVERHEAD_FACTOR,
            agents=",".join(agent_urls),
            lease_s=20.0,
            reconcile_period_s=2.0,
            recovery_ramp_s=4.0,
            recovery_steps=2,
            vtn_url=vtn.url,
            ven_name="flexgate-lab",
            meter_url=meter_url,
            meter_period_s=METER_PERIOD_S,
            meter_lag_s=METER_TIME_CONSTANT_S,
            calibrate=False,
            tracking=tracking,
        )
        url = stack.enter_context(ServerThread(create_app(settings)))
        api = stack.enter_context(
            httpx.Client(
                base_url=url, timeout=20, headers={"Authorization": f"Bearer {LAB_API_TOKEN}"}
            )
        )
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
        trace = watch(api, duration_s, requested, console, earlier=earlier)
        return read_result(api, trace, tracking)


def read_result(
    api: httpx.Client, trace: list[tuple[float, float, float, str]], tracking: bool
) -> dict[str, Any]:
    """What the latest event did, read from the gateway after it: for `report`."""
    events = api.get("/v1/events").json()["events"]
    event = events[-1] if events else None
    plan = api.get(f"/v1/plans/{event['plan_id']}").json() if event and event["plan_id"] else None
    return {
        "tracking": tracking,
        "trace": trace,
        "event": event,
        "plan": plan,
        "sync": api.get("/v1/sync").json(),
        "nodes": api.get("/v1/nodes").json()["nodes"],
        "delivered_kw": delivered_kw(trace),
    }


def delivered_kw(trace: list[tuple[float, float, float, str]]) -> float:
    """What the event shed at the meter: the mean before it less the mean over the settled
    second half of it (the loop's window and the agents' telemetry have filled by then)."""
    before = [kw for _, kw, _, status in trace if status in ("pending", "waiting for the VTN")]
    active = [kw for _, kw, _, status in trace if status == "active"]
    settled = active[len(active) // 2 :]
    if not before or not settled:
        return 0.0
    return float(np.mean(before[-10:]) - np.mean(settled))


def watch(
    api: httpx.Client,
    duration_s: float,
    requested: float,
    console: Console,
    start_after_s: float = START_AFTER_S,
    earlier: frozenset[str] = frozenset(),
) -> list[tuple[float, float, float, str]]:
    """Site power at the meter every half second until the event, starting `start_after_s`
    from now, has ended and power is back at the baseline (the caps are all released):
    (t, kW, target, status); the target is the power before the event less the request."""
    trace: list[tuple[float, float, float, str]] = []
    begin = time.monotonic()
    deadline = begin + start_after_s + duration_s + RECOVERY_WAIT_S
    recovered = 0
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while time.monotonic() < deadline:
            site = api.get("/v1/site").json()
            events = [e for e in api.get("/v1/events").json()["events"] if e["id"] not in earlier]
            status = events[-1]["status"] if events else "waiting for the VTN"
            before = [kw for _, kw, _, s in trace if s in ("pending", "waiting for the VTN")]
            baseline = float(np.mean(before[-10:])) if before else site["facility_power_kw"]
            target = baseline - requested if status == "active" else baseline
            trace.append((time.monotonic() - begin, site["facility_power_kw"], target, status))
            table = Table(title="flexgate lab", show_header=False)
            table.add_row("event", status)
            table.add_row(
                f"site power ({site['meter']['source']})", f"{site['facility_power_kw']:.1f} kW"
            )
            table.add_row("target", f"{target:.1f} kW")
            tracking = site.get("tracking") or {}
            if tracking.get("active"):
                table.add_row("site loop correction", f"{tracking['correction_kw']:+.2f} kW")
            if events and events[-1]["plan_id"] and status == "active":
                plan = api.get(f"/v1/plans/{events[-1]['plan_id']}").json()
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
    results: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    requested: float,
    out: Path,
    console: Console,
) -> int:
    final = results[-1]
    event, plan = final["event"], final["plan"]
    if event is None:
        console.print("[red]the VTN's event never reached the gateway[/]")
        return 1
    achieved = final["delivered_kw"]
    ok = abs(achieved - requested) <= TOLERANCE * requested
    table = Table(title="flexgate lab report", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", overflow="fold")  # an id is never cut short
    table.add_row("event", event["id"])
    table.add_row("status", f"{event['status']}, opted {event['opt']}")
    table.add_row("requested at the meter", f"{requested:.1f} kW")
    for result in results:
        label = "closed loop" if result["tracking"] else "open loop"
        delivered = result["delivered_kw"]
        within = abs(delivered - requested) <= TOLERANCE * requested
        table.add_row(
            f"delivered at the meter ({label})" if len(results) > 1 else "achieved (settled mean)",
            f"{delivered:.2f} kW ({(delivered - requested) / requested:+.1%}) "
            + ("[green]within 5%[/]" if within else "[red]outside 5%[/]"),
        )
    if plan:
        before = sum(j["throughput"] / j["throughput_fraction"] for j in plan["jobs"])
        after = sum(j["throughput"] for j in plan["jobs"])
        table.add_row("throughput kept, site", f"{after / before:.1%}")
        for j in plan["jobs"]:
            table.add_row(f"  {j['id']}", f"{j['throughput_fraction']:.1%} at {j['cap_w']:.0f} W")
    console.print(table)
    periods: dict[str, list[float]] = {p["node"]: [] for j in jobs for p in j["placement"]}
    for j in jobs:
        for p in j["placement"]:
            periods[p["node"]].append(j["period_s"])
    loops = Table(title="control delay against T/2")
    for name in ("loop", "delay p99", "shortest T/2", "verdict"):
        loops.add_column(name, justify="right")
    for node in final["nodes"]:
        delay = (node["actuation_delay"] or {}).get("p99_s")
        half = min(periods.get(node["node"], [float("nan")])) / 2
        loops.add_row(
            f"agent {node['node']}",
            "-" if delay is None else f"{delay * 1000:.2f} ms",
            f"{half:.2f} s",
            "-" if delay is None else ("below T/2" if delay < half else "[red]above T/2[/]"),
        )
    sync = final["sync"]
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
    plot_lab(final["trace"], requested, path)
    (out / "lab-report.json").write_text(
        json.dumps(
            {
                "requested_kw": requested,
                "achieved_kw": achieved,
                "met": ok,
                "event": event,
                "plan": plan,
                "sync": sync,
                "runs": [
                    {
                        "loop": "closed" if r["tracking"] else "open",
                        "delivered_kw": r["delivered_kw"],
                        "error": (r["delivered_kw"] - requested) / requested,
                    }
                    for r in results
                ],
            },
            indent=2,
            default=str,
        )
    )
    console.print(f"plot: {path}")
    return 0 if ok else 1
