"""`flexgate lab`: the whole chain on loopback, and a report (docs/cli.md).

Simulated agents (N nodes of G GPUs in one process, under `/nodes/N`), a lab facility meter
(`flexgate.lab.meter`: the agents' true GPU power through a static load, an overhead factor, a
cooling lag and noise), a mock VTN (openleadr's VTN) and the gateway with its VEN, each on a
free loopback port, with SQLite in a temporary folder. The job mix is drawn from the PFI
study's job types. The VTN issues a LOAD_DISPATCH delta of `reduction` times the site's
GPU-attributable facility power; the lab shows site power live and ends with a report and a
PNG plot. What was delivered is read at the meter: its mean before the event less its mean
over the settled part of the event.

With `mismatch`, the agents run a truth drawn away from the declared mix and the meter a
different overhead factor and a static load (`flexgate.lab.simsite.draw_truth`), and the lab runs
the event twice, open loop (the model's plan alone) and closed loop (the site loop at the
meter). Exit 0 when the (closed-loop) site met the target within 5%.

With `characterise`, the gateway is told no PFIs: every job is probed first, and the report
compares the estimates with the truth and the event's throughput kept with an oracle plan on
the true curves (`flexgate.lab.characterise`).

With `openadr="3.1"` the VTN is the OpenADR 3.1 mock VTN (`flexgate.lab.mockvtn31`) and the event
the 3.1 form of the same request (CONTROL_SETPOINT, -requested kW), delivered by webhook.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console

from agents.run import jobs_on_node
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.lab import characterise as lab_characterise
from flexgate.lab.jobs import AGENT_TOKEN, OVERHEAD_FACTOR, lab_jobs
from flexgate.lab.meter import LabMeter, MeterFault
from flexgate.lab.meter import create_app as meter_app
from flexgate.lab.mockvtn import MockVtn
from flexgate.lab.mockvtn31 import LAB_CLIENT_ID, LAB_CLIENT_SECRET, MockVtn31
from flexgate.lab.report import START_AFTER_S, read_result, report, watch
from flexgate.lab.simsite import Truth, draw_truth
from flexgate.serve import ServerThread, free_port
from flexmodel.jobmix import parse_job_mix
from gateway.app import create_app
from gateway.openadr.webhook31 import CALLBACK_PATH
from gateway.settings import LAB_API_TOKEN, GatewaySettings

#: The mismatched truth's static load (the declared site has none) [kW]
STATIC_KW = 5.0
METER_PERIOD_S = 0.5
METER_TIME_CONSTANT_S = 1.0
#: The lab meter averages the agents' GPU samples over this before its lag [s].
METER_INTEGRATION_S = 1.0
METER_NOISE_KW = 0.05


@dataclass(frozen=True)
class LabEvent:
    """What the lab asks for, of which site: the declared jobs and the truth they run."""

    jobs: list[dict[str, Any]]
    truth: Truth
    attributable_kw: float  #: the site's GPU-attributable facility power
    requested_kw: float


@dataclass(frozen=True)
class LabSite:
    """The lab's servers, running: the agents under `/nodes/N` and the meter."""

    folder: Path
    agent_urls: list[str]
    meter: LabMeter
    meter_url: str  #: the meter's reading (`/meter`)


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
    openadr: str = "2.0b",
    characterise: bool = False,
    meter_dead_s: float = 0.0,
    fault: MeterFault | None = None,
) -> int:
    """`meter_dead_s`: the lab meter's own transport delay (the gateway is told it, as a
    calibration would identify it); `fault`: a meter fault from that long into the event."""
    console = console or Console()
    # openleadr's advice to VTN implementers (ven_lookup, report handlers) is not for lab users.
    logging.getLogger("openleadr").setLevel(logging.ERROR)
    event = lab_event(nodes, gpus_per_node, reduction, seed, mismatch)
    tmp = Path(tempfile.mkdtemp(prefix="flexgate-lab-"))
    agents = lab_agents(event, nodes, gpus_per_node, tmp, characterise)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)  # last: after every server
        site = serve_site(stack, agents, event.truth, tmp, seed, meter_dead_s)
        console.print(
            f"lab: {nodes} nodes x {gpus_per_node} GPUs, {len(event.jobs)} jobs; the VTN asks "
            f"for {event.requested_kw:.1f} kW ({reduction:.0%} of {event.attributable_kw:.1f} "
            f"kW) for {duration_s:g} s"
        )
        if mismatch:
            _say_mismatch(event, console)
        told, found = event.jobs, None
        extra: dict[str, Any] = {"meter_dead_s": meter_dead_s}
        if characterise:
            told = lab_characterise.undeclared(event.jobs)
            extra |= lab_characterise.PROBE_SETTINGS
            found = lab_characterise.characterise(
                tmp / "gateway", gateway_settings(site.agent_urls, site.meter_url), told, console
            )
        on_active = None if fault is None else lambda: site.meter.fault_after(fault)
        results = run_passes(
            site, event, told, duration_s, mismatch, console, openadr, extra, on_active
        )
        code = report(results, event.jobs, event.requested_kw, out, console)
        if found is not None:
            _report_characterisation(found, results[-1]["plan"], event.truth.jobs, out, console)
        return code


def lab_event(
    nodes: int, gpus_per_node: int, reduction: float, seed: int, mismatch: bool
) -> LabEvent:
    """The lab's jobs, the truth they run (with `mismatch`, drawn away from what is declared)
    and what the VTN asks for: `reduction` of the site's GPU-attributable facility power."""
    jobs = lab_jobs(nodes, gpus_per_node, seed)
    mix = parse_job_mix({"overhead_factor": OVERHEAD_FACTOR, "jobs": jobs})
    attributable = mix.overhead_factor * mix.baseline_gpu_kw
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
    return LabEvent(jobs, truth, attributable, round(reduction * attributable, 1))


def lab_agents(
    event: LabEvent, nodes: int, gpus_per_node: int, folder: Path, characterise: bool
) -> list[AgentNode]:
    """One simulated agent per node, running the truth."""
    true_mix = parse_job_mix({"jobs": event.truth.jobs})
    return [
        AgentNode(
            n,
            SimulatedBackend(gpus_per_node, mix=true_mix, node_id=n),
            folder / n,
            sample_hz=20,
            # the jobs' telemetry (periods per cap level) is what characterisation measures
            jobs=jobs_on_node(true_mix, n, gpus_per_node) if characterise else None,
        )
        for n in (f"node-{i + 1:02d}" for i in range(nodes))
    ]


def serve_site(
    stack: contextlib.ExitStack,
    agents: list[AgentNode],
    truth: Truth,
    folder: Path,
    seed: int,
    meter_dead_s: float,
) -> LabSite:
    """The agents and the lab meter reading them through the truth, each on a loopback port
    (stopped when `stack` closes)."""
    agents_url = stack.enter_context(ServerThread(agent_app(agents, AGENT_TOKEN, prefixed=True)))
    agent_urls = [f"{agents_url}/nodes/{a.node_id}" for a in agents]
    meter = LabMeter(
        agent_urls,
        static_kw=truth.static_kw,
        overhead_factor=truth.overhead_factor,
        noise_kw=METER_NOISE_KW,
        time_constant_s=METER_TIME_CONSTANT_S,
        integration_s=METER_INTEGRATION_S,
        period_s=METER_PERIOD_S / 2,
        seed=seed,
        dead_s=meter_dead_s,
    )
    meter_url = stack.enter_context(ServerThread(meter_app(meter)))
    return LabSite(folder, agent_urls, meter, f"{meter_url}/meter")


def _say_mismatch(event: LabEvent, console: Console) -> None:
    truth = event.truth
    console.print(
        f"mismatch: the truth's overhead factor {truth.overhead_factor:g} (declared "
        f"{OVERHEAD_FACTOR:g}), static load {truth.static_kw:g} kW (declared 0), "
        + ", ".join(
            f"{d['id']}: {t['power_w']:g} W (declared {d['power_w']:g}), "
            f"duty {t['duty']:g} ({d['duty']:g})"
            for d, t in zip(event.jobs, truth.jobs, strict=True)
        )
    )


def run_passes(
    site: LabSite,
    event: LabEvent,
    told: list[dict[str, Any]],
    duration_s: float,
    mismatch: bool,
    console: Console,
    openadr: str,
    extra: dict[str, Any],
    on_active: Callable[[], None] | None,
) -> list[dict[str, Any]]:
    """The event once (closed loop), or with `mismatch` twice: open loop, then closed loop."""
    passes = [("open loop", False), ("closed loop", True)] if mismatch else [("", True)]
    results: list[dict[str, Any]] = []
    for name, tracking in passes:
        if name:
            console.print(f"[bold]{name}[/]")
        results.append(
            run_event(
                site.folder / "gateway",  # one store: the generation goes on rising
                site.agent_urls,
                site.meter_url,
                told,
                event.requested_kw,
                duration_s,
                tracking,
                console,
                frozenset(r["event"]["id"] for r in results if r["event"]),
                openadr,
                extra,
                on_active=on_active,
            )
        )
    return results


def _report_characterisation(
    found: dict[str, Any],
    plan: dict[str, Any] | None,
    truth_jobs: list[dict[str, Any]],
    out: Path,
    console: Console,
) -> None:
    truth, default = lab_characterise.mixes(truth_jobs, OVERHEAD_FACTOR)
    rows = lab_characterise.estimates(found["curves"], truth)
    kept = lab_characterise.throughput_kept(plan, truth, default)
    lab_characterise.show(rows, kept, console)
    doc = {"probe": found["probe"], "estimates": rows, "throughput": kept}
    out.mkdir(parents=True, exist_ok=True)
    (out / "lab-characterise.json").write_text(json.dumps(doc, indent=2, default=str))


def gateway_settings(agent_urls: list[str], meter_url: str) -> dict[str, Any]:
    """The lab gateway's settings, but for its store, VTN and site loop."""
    return {
        "lab": True,
        "agent_token": AGENT_TOKEN,
        "overhead_factor": OVERHEAD_FACTOR,
        "agents": ",".join(agent_urls),
        "lease_s": 20.0,
        "reconcile_period_s": 2.0,
        "recovery_ramp_s": 4.0,
        "recovery_steps": 2,
        "meter_url": meter_url,
        "meter_period_s": METER_PERIOD_S,
        # the meter's path, as a calibration would identify it, and its noise
        "meter_lag_s": METER_TIME_CONSTANT_S,
        "meter_averaging_s": METER_INTEGRATION_S,
        "meter_noise_kw": METER_NOISE_KW,
        "calibrate": False,
    }


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
    openadr: str = "2.0b",
    extra: dict[str, Any] | None = None,
    on_active: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One event from the mock VTN through a fresh gateway on the lab's store (`earlier`: the
    events of the runs before; `extra`: more settings): the trace and what it read."""

    def say(line: str) -> None:
        console.print(f"[dim]{line}[/]")

    with contextlib.ExitStack() as stack:
        vtn_settings, port = (
            _vtn31(stack, requested, duration_s, say)
            if openadr == "3.1"
            else (_vtn20b(stack, requested, duration_s, say), 0)
        )
        settings = GatewaySettings(
            database_url=f"sqlite:///{folder / 'gateway.db'}",
            ven_name="flexgate-lab",
            tracking=tracking,
            **gateway_settings(agent_urls, meter_url),
            **vtn_settings,
            **(extra or {}),
        )
        url = stack.enter_context(ServerThread(create_app(settings), port=port))
        console.print(f"dashboard: {url}/ (API token {LAB_API_TOKEN})")
        api = stack.enter_context(
            httpx.Client(
                base_url=url, timeout=20, headers={"Authorization": f"Bearer {LAB_API_TOKEN}"}
            )
        )
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
        trace = watch(api, duration_s, requested, console, earlier=earlier, on_active=on_active)
        return read_result(api, trace, tracking)


def _vtn20b(
    stack: contextlib.ExitStack, requested: float, duration_s: float, say: Any
) -> dict[str, Any]:
    """openleadr's VTN issuing a LOAD_DISPATCH delta; the gateway's settings for it."""
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
    vtn = MockVtn(scenario, port=free_port(), say=say)
    stack.callback(vtn.stop)
    vtn.start()
    return {"vtn_url": vtn.url}


def _vtn31(
    stack: contextlib.ExitStack, requested: float, duration_s: float, say: Any
) -> tuple[dict[str, Any], int]:
    """The OpenADR 3.1 mock VTN issuing a CONTROL_SETPOINT once the VEN registered; the
    gateway's settings for it, and the port the gateway must serve its webhook on."""
    vtn = MockVtn31(say=say)
    vtn.issue_after_registration(requested, START_AFTER_S, duration_s)
    vtn_url = stack.enter_context(ServerThread(vtn.app))
    port = free_port()
    return {
        "openadr": "3.1",
        "vtn_url": vtn_url,
        "vtn_client_id": LAB_CLIENT_ID,
        "vtn_client_secret": LAB_CLIENT_SECRET,
        "vtn_poll_s": 5.0,
        "ven_callback_url": f"http://127.0.0.1:{port}{CALLBACK_PATH}",
    }, port
