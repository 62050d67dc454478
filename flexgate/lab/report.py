"""Watching one event through the gateway's API, and the lab's report on it.

`watch` samples site power at the meter every half second until the event has ended and power
is back at the baseline; `read_result` reads what the event did; `delivered_kw` is what it shed
at the meter; `report` prints the table (requested against delivered, throughput kept, every
loop's delay against T/2, the sync verdict), draws the PNG and writes `lab-report.json`. The
lab (`flexgate.lab.run`) and the compose lab (`flexgate.lab.compose`) both use them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from flexgate.lab.plots import plot_lab, plot_lock

TOLERANCE = 0.05
#: The windows of the two "delivered" figures a lab shows (they differ: the gateway's counts
#: the ramp into the target, the lab's only the settled half).
ACHIEVED_WINDOW = "the event's settled second half, against the 5 s before it (the lab's watch)"
RECORDED_WINDOW = "all of the event the site loop read the meter, ramp included (the gateway's)"
#: The event starts this long after the lab: the meter's window fills first [s]
START_AFTER_S = 18.0
#: After the event the lab watches until site power is back at the baseline (within
#: TOLERANCE of the request) for this many samples in a row, or this long at most [s].
RECOVERED_SAMPLES = 4
RECOVERY_WAIT_S = 40.0


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
    on_active: Callable[[], None] | None = None,
) -> list[tuple[float, float, float, str]]:
    """Site power at the meter every half second until the event, starting `start_after_s`
    from now, has ended and power is back at the baseline (the caps are all released):
    (t, kW, target, status); the target is the power before the event less the request.
    `on_active()` is called once, when the event is first seen active."""
    trace: list[tuple[float, float, float, str]] = []
    begin = time.monotonic()
    deadline = begin + start_after_s + duration_s + RECOVERY_WAIT_S
    recovered = 0
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while time.monotonic() < deadline:
            site = api.get("/v1/site").json()
            events = [e for e in api.get("/v1/events").json()["events"] if e["id"] not in earlier]
            status = events[-1]["status"] if events else "waiting for the VTN"
            if status == "active" and on_active is not None:
                on_active()
                on_active = None
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
            if site["meter"]["fault"]:
                table.add_row("meter fault", site["meter"]["fault"])
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
    """The lab's report on its runs of the event (the last one's is the verdict): the table of
    requested against delivered and throughput kept, every loop's delay against T/2, the sync
    verdict; `lab-site-power.png` and `lab-report.json` in `out`. 0 when the last run
    delivered the request within 5% at the meter."""
    final = results[-1]
    if final["event"] is None:
        console.print("[red]the VTN's event never reached the gateway[/]")
        return 1
    console.print(_delivery_table(results, requested))
    console.print(
        f"settled half: {ACHIEVED_WINDOW}; whole event: {RECORDED_WINDOW}, so it reads lower"
    )
    console.print(_loops_table(final, jobs))
    console.print(
        "T/2 is for reading; the verdict is the sync analysis': the attractive windows repeat "
        "every period, an integrating loop's begin at T/4, harmonic 3's at T/6 (docs/sync.md)"
    )
    console.print(f"sync verdict: {final['sync']['verdict']}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lab-site-power.png"
    plot_lab(final["trace"], requested, path)
    ok = _met(final["delivered_kw"], requested)
    doc = _report_doc(results, requested, ok)
    (out / "lab-report.json").write_text(json.dumps(doc, indent=2, default=str))
    console.print(f"plot: {path}")
    return 0 if ok else 1


def _met(delivered: float, requested: float) -> bool:
    return abs(delivered - requested) <= TOLERANCE * requested


def _delivery_table(results: list[dict[str, Any]], requested: float) -> Table:
    """The event, requested against delivered at the meter (each run) and as the gateway
    recorded it, and the throughput the plan kept."""
    event, plan = results[-1]["event"], results[-1]["plan"]
    table = Table(title="flexgate lab report", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(justify="right", overflow="fold")  # an id is never cut short
    table.add_row("event", event["id"])
    table.add_row("status", f"{event['status']}, opted {event['opt']}")
    table.add_row("requested at the meter", f"{requested:.1f} kW")
    for result in results:
        label = "closed loop" if result["tracking"] else "open loop"
        delivered = result["delivered_kw"]
        table.add_row(
            f"delivered at the meter ({label}, settled half)"
            if len(results) > 1
            else "achieved at the meter (settled half)",
            f"{delivered:.2f} kW ({(delivered - requested) / requested:+.1%}) "
            + ("[green]within 5%[/]" if _met(delivered, requested) else "[red]outside 5%[/]"),
        )
    recorded = event.get("delivery")
    if recorded:
        table.add_row(
            "delivered, the gateway's record (whole event)",
            f"{recorded['delivered_kw']:.2f} kW over {recorded['measured_s']:.0f} s",
        )
    if plan:
        before = sum(j["throughput"] / j["throughput_fraction"] for j in plan["jobs"])
        after = sum(j["throughput"] for j in plan["jobs"])
        table.add_row("throughput kept, site", f"{after / before:.1%}")
        for j in plan["jobs"]:
            table.add_row(f"  {j['id']}", f"{j['throughput_fraction']:.1%} at {j['cap_w']:.0f} W")
    return table


def _loops_table(final: dict[str, Any], jobs: list[dict[str, Any]]) -> Table:
    """Every loop's delay against the shortest T/2 it meets: each agent's, then the sync
    analysis' loops with their verdicts."""
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
            # per-GPU caps held by the firmware: whatever the delay, no job is coupled
            "-"
            if delay is None
            else f"safe: couples no jobs ({'below' if delay < half else 'above'} T/2)",
        )
    for loop in final["sync"]["loops"]:
        loops.add_row(
            loop["name"],
            f"{loop['delay_s']:.3g} s (window {loop['window_s']:.3g} s)",
            "-"
            if loop["shortest_half_period_s"] is None
            else f"{loop['shortest_half_period_s']:.2f} s",
            loop["verdict"],
        )
    return loops


def _report_doc(results: list[dict[str, Any]], requested: float, ok: bool) -> dict[str, Any]:
    """`lab-report.json`: the request, the last run's delivery and records, every run's."""
    final = results[-1]
    return {
        "requested_kw": requested,
        "achieved_kw": final["delivered_kw"],
        "achieved_window": ACHIEVED_WINDOW,
        #: `event.delivery.delivered_kw` is the gateway's figure, over this window
        "delivery_window": RECORDED_WINDOW,
        "met": ok,
        "event": final["event"],
        "plan": final["plan"],
        "sync": final["sync"],
        "runs": [
            {
                "loop": "closed" if r["tracking"] else "open",
                "delivered_kw": r["delivered_kw"],
                "error": (r["delivered_kw"] - requested) / requested,
            }
            for r in results
        ],
    }


def lock_report(result: dict[str, Any], out: Path, console: Console) -> int:
    """The lock lab's table (r1..r3 and the swing ratio of each run, its loop, scattering's
    unlock time and cost), `lab-lock-report.json` and the PNG (`plot_lock`). 0 when the
    unsafe loop locked the jobs (r1 above 0.8), the default loop kept them apart and
    scattering unlocked them (r1 below the Rayleigh threshold)."""
    threshold = result["threshold"]
    runs = result["runs"]
    table = Table(
        title=f"flexgate lock lab: {result['jobs']} jobs, Rayleigh threshold {threshold:.3f}"
    )
    for name in ("run", "r1", "r2", "r3", "swing ratio", "site loop", "verdict"):
        table.add_column(name, justify="right")
    for run in runs:
        order, loop = run["order_parameters"], run["loop"]
        table.add_row(
            run["name"],
            *(f"{order[k]:.2f}" for k in ("r1", "r2", "r3")),
            f"{run['swing_ratio']:.2f} (sqrt N {result['sqrt_n']:.1f})",
            f"window {loop['window_s']:.2g} s, gain {loop['gain']:g}, "
            f"delay {loop['delay_s']:.2f} s",
            str(loop["verdict"]),
        )
    console.print(table)
    locked, safe, scattered = (run["order_parameters"]["r1"] for run in runs)
    episode = runs[2]["scattering"]["episode"] or {}
    unlock = result["unlock_s"]
    console.print(
        f"scattering: {episode.get('reason', 'did not start')}; rate spread "
        f"{episode.get('rate_spread', 0):g}; r1 below the threshold "
        + (f"{unlock:.0f} s after it was switched on" if unlock is not None else "[red]never[/]")
        + f"; throughput {-result['scattering_throughput_cost']:+.2%} against the locked run "
        f"(the jobs' true throughput, during the event, loop gain {result['loop_gain']:g}: "
        f"k_i = {result['integral_gain_per_s']:g}/s)"
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lab-lock.png"
    plot_lock(result["records"], threshold, path)
    doc = {k: v for k, v in result.items() if k != "records"}
    (out / "lab-lock-report.json").write_text(json.dumps(doc, indent=2, default=str))
    console.print(f"plot: {path}")
    return 0 if locked > 0.8 and safe < threshold and scattered < threshold else 1
