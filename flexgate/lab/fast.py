"""`flexgate lab --scenario fast`: a frequency dip and the site's GPU power against it.

Simulated agents (N nodes of G GPUs under `/nodes/N`, checking fast triggers), a grid (a
line-per-reading TCP feed, 50 readings a second) and the gateway arming 10/20/30/40 % of the
site with its frequency trigger in droop mode reading the grid (docs/fast.md, "The frequency
trigger"), each on a loopback port. The grid plays a dip: 50 Hz, a fall to `low_hz` over a
second, held, and back. The lab samples the frequency the grid sends and the site's summed GPU
power (the simulated GPUs' instant power) every 50 ms, and writes both (CSV and PNG) with the
fast events the dip fired.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from agents.fasttrigger import TriggerGuard
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.lab.jobs import AGENT_TOKEN, OVERHEAD_FACTOR, lab_jobs
from flexgate.lab.plots import plot_fast
from flexgate.serve import ServerThread
from flexmodel.jobmix import parse_job_mix
from gateway.app import create_app
from gateway.settings import LAB_API_TOKEN, GatewaySettings

LAB_FAST_SECRET = "flexgate-lab-fast-secret"
NOMINAL_HZ = 50.0
GRID_LINE_S = 0.02
SAMPLE_S = 0.05
DIP_AT_S = 3.0  #: the dip starts this long into the record [s]
FALL_S = 1.0


def dip_hz(t_s: float, low_hz: float, hold_s: float) -> float:
    """The grid's frequency `t_s` into the record: nominal, a linear fall over FALL_S to
    `low_hz`, held `hold_s`, a linear rise back over FALL_S."""
    into = t_s - DIP_AT_S
    depth = NOMINAL_HZ - low_hz
    if into <= 0.0 or into >= 2 * FALL_S + hold_s:
        return NOMINAL_HZ
    share = min(into / FALL_S, 1.0, (2 * FALL_S + hold_s - into) / FALL_S)
    return NOMINAL_HZ - depth * share


class Grid(socketserver.ThreadingTCPServer):
    """Sends `hz` as one line every GRID_LINE_S to whoever connects."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Lines)
        self.hz = NOMINAL_HZ
        self.stopped = threading.Event()


class _Lines(socketserver.BaseRequestHandler):
    server: Grid

    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while not self.server.stopped.is_set():
                self.request.sendall(f"{self.server.hz:.4f}\n".encode())
                time.sleep(GRID_LINE_S)


def lab_settings(folder: Path, agent_urls: list[str], grid_port: int) -> GatewaySettings:
    return GatewaySettings(
        database_url=f"sqlite:///{folder / 'gateway.db'}",
        lab=True,
        agent_token=AGENT_TOKEN,
        agents=",".join(agent_urls),
        overhead_factor=OVERHEAD_FACTOR,
        lease_s=20.0,
        fast_depths="10,20,30,40",
        fast_secret=LAB_FAST_SECRET,
        frequency_url=f"tcp://127.0.0.1:{grid_port}",
        frequency_mode="droop",
        frequency_full_hz=49.5,
        frequency_stiffness_hz_per_mw=0.0001,
        frequency_retrigger_s=0.5,
        frequency_hold_s=3.0,
    )


def run_fast(
    *,
    nodes: int,
    gpus_per_node: int,
    low_hz: float,
    hold_s: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The dip through the whole chain: the trace [(t, hz, gpu_kw)] and the fast events."""
    folder = Path(tempfile.mkdtemp(prefix="flexgate-fast-"))
    jobs = lab_jobs(nodes, gpus_per_node)
    mix = parse_job_mix({"jobs": jobs})
    names = [f"node-{i + 1:02d}" for i in range(nodes)]
    agents = [
        AgentNode(n, SimulatedBackend(gpus_per_node, mix=mix, node_id=n), folder / n) for n in names
    ]
    guard = TriggerGuard(LAB_FAST_SECRET, 2.0)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        url = stack.enter_context(
            ServerThread(agent_app(agents, AGENT_TOKEN, prefixed=True, fast=guard))
        )
        grid = Grid()
        threading.Thread(target=grid.serve_forever, daemon=True).start()
        stack.callback(grid.server_close)
        stack.callback(grid.shutdown)
        stack.callback(grid.stopped.set)
        settings = lab_settings(folder, [f"{url}/nodes/{n}" for n in names], grid.server_address[1])
        api = stack.enter_context(
            httpx.Client(
                base_url=stack.enter_context(ServerThread(create_app(settings))),
                timeout=20,
                headers={"Authorization": f"Bearer {LAB_API_TOKEN}"},
            )
        )
        api.put("/v1/jobs", json={"jobs": jobs}).raise_for_status()
        _wait_armed(api, say)

        def gpu_kw() -> float:
            return sum(a.backend.power_w(g) for a in agents for g in range(gpus_per_node)) / 1e3

        trace = _play(grid, gpu_kw, low_hz, hold_s)
        events = [e for e in api.get("/v1/events").json()["events"] if e["source"] == "fast"]
        return {
            "trace": trace,
            "events": events,
            "armed": api.get("/v1/fast/armed").json(),
            "frequency": api.get("/v1/fast/frequency").json(),
        }


def _wait_armed(api: httpx.Client, say: Callable[[str], None]) -> None:
    for _ in range(400):
        armed, hz = api.get("/v1/fast/armed").json(), api.get("/v1/fast/frequency").json()
        if armed["settled"] and armed["generation"] > 0 and hz["hz"] is not None:
            say(f"armed: {armed['expected_reduction_kw']} kW; the feed reads {hz['hz']} Hz")
            return
        time.sleep(0.05)
    raise RuntimeError("the fast plans were not armed, or the feed not read, within 20 s")


def _play(
    grid: Grid, gpu_kw: Callable[[], float], low_hz: float, hold_s: float
) -> list[tuple[float, float, float]]:
    trace, start = [], time.monotonic()
    end_s = DIP_AT_S + 2 * FALL_S + hold_s + 3.5  # the last hold runs out within it
    while (t := time.monotonic() - start) < end_s:
        grid.hz = dip_hz(t, low_hz, hold_s)
        trace.append((t, grid.hz, gpu_kw()))
        time.sleep(SAMPLE_S)
    return trace


def fast_report(result: dict[str, Any], hold_s: float, out: Path, console: Console) -> int:
    """The dip's fast events, the GPU power before the dip and while it held, the droop's
    phase report; `lab-fast.png`, `lab-fast.csv`, `lab-fast-report.json`. 0 when the dip
    fired the fast path and the GPU power fell."""
    trace = result["trace"]

    def mean_kw(start_s: float, end_s: float) -> float:
        kw = [k for t, _, k in trace if start_s <= t < end_s]
        return sum(kw) / len(kw)

    before = mean_kw(0.0, DIP_AT_S)
    held = mean_kw(DIP_AT_S + FALL_S + 1.0, DIP_AT_S + FALL_S + hold_s)
    events = sorted(result["events"], key=lambda e: e["start"])
    for event in events:
        console.print(f"{event['start']}: {event['reason']}")
        for stretch in event["intervals"]:  # its renewals and changes of depth
            renewals = len(stretch.get("triggers", [])) - 1
            console.print(
                f"  from {stretch['start']}: {stretch.get('depth_pct', 0):g}% "
                f"({renewals} renewal{'' if renewals == 1 else 's'})"
            )
    droop = result["frequency"]["droop"]
    console.print(
        f"GPU power: {before:.1f} kW before the dip, {held:.1f} kW while it held "
        f"({before - held:+.1f} kW); the droop's delay {droop['delay_s']:g} s lags a 1 Hz "
        f"mode {droop['worst_phase_lag_deg']:.0f} degrees (bound {droop['bound_deg']:g})"
    )
    out.mkdir(parents=True, exist_ok=True)
    plot_fast(trace, out / "lab-fast.png")
    rows = ["t_s,hz,gpu_kw"] + [f"{t:.3f},{hz:.4f},{kw:.3f}" for t, hz, kw in trace]
    (out / "lab-fast.csv").write_text("\n".join(rows) + "\n")
    doc = {k: v for k, v in result.items() if k != "trace"}
    doc |= {"gpu_kw_before": before, "gpu_kw_held": held}
    (out / "lab-fast-report.json").write_text(json.dumps(doc, indent=2))
    console.print(f"plot: {out / 'lab-fast.png'}")
    return 0 if events and held < before else 1
