"""How the `flexgate` commands print: one JSON document with `--json`, else tables for people;
a progress bar on a terminal, and the plot a long command was asked for."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from flexgate.cli.readers import BadInputError
from flexmodel.jobs import JobMix


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")


def progress(label: str, *columns: Any) -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    console = Console(stderr=True)
    return Progress(
        TextColumn(label),
        BarColumn(),
        *columns,
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def check_plot(path: Path | None) -> None:
    if path is not None and not path.parent.is_dir():
        raise BadInputError(f"--plot: folder {path.parent} does not exist")


def plot_and_print(
    args: argparse.Namespace,
    doc: dict[str, Any],
    plotter: str,
    data: Any,
    show: Callable[[dict[str, Any]], None],
) -> int:
    """Draw the plot when asked, then print the document (JSON or for people)."""
    if args.plot is not None:
        from flexgate.lab import plots  # matplotlib costs 0.2 s: load it when asked

        getattr(plots, plotter)(data, args.plot)
        doc["plot"] = str(args.plot)
    if args.json:
        print_json(doc)
    else:
        show(doc)
    return 0


def show_allocation(doc: dict[str, Any], mix: JobMix) -> None:
    console = Console()
    table = Table(title=f"{doc['strategy']} allocation ({doc['objective']})")
    for name in ("job", "GPUs", "cap W", "mean power W", "throughput", "kept"):
        table.add_column(name, justify="left" if name == "job" else "right")
    for job, row in zip(mix.jobs, doc["jobs"], strict=True):
        table.add_row(
            row["id"],
            str(job.gpus),
            f"{row['cap_w']:.0f}",
            f"{row['power_w']:.0f}",
            f"{row['throughput']:,.0f}",
            f"{row['throughput_fraction']:.1%}",
        )
    console.print(table)
    state = (
        "[green]feasible[/]" if doc["feasible"] else "[red]infeasible: delivering the maximum[/]"
    )
    console.print(
        f"requested {doc['requested_facility_kw']:.1f} kW at the meter ({state}); achieved "
        f"{doc['achieved_facility_kw']:.1f} kW = {doc['achieved_gpu_kw']:.1f} GPU kW x "
        f"{mix.overhead_factor:g}; most the mix can shed: {doc['max_facility_kw']:.1f} kW"
    )
    kept = doc["throughput_after"] / doc["throughput_before"] if doc["throughput_before"] else 1.0
    console.print(
        f"throughput {doc['throughput_before']:,.0f} -> {doc['throughput_after']:,.0f} tokens/s "
        f"({kept:.1%} kept); optimality gap bound {doc['optimality_gap_bound']:.3g}"
    )


def show_quote(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"supply curve over {doc['window_s']:g} s (k = {doc['overhead_factor']:g})")
    for name in ("facility kW shed", "tokens/s lost", "share of throughput"):
        table.add_column(name, justify="right")
    for row in doc["supply_curve"]:
        table.add_row(
            f"{row['facility_kw']:.1f}",
            f"{row['throughput_loss']:,.0f}",
            f"{row['throughput_loss_fraction']:.1%}",
        )
    console.print(table)
    console.print(
        f"achievable {doc['achievable_kw']:.1f} kW "
        f"(losing {doc['achievable_throughput_loss']:,.0f} tokens/s); "
        f"firm at {doc['confidence']:.0%}: {doc['firm_kw']:.1f} kW "
        f"(losing {doc['firm_throughput_loss']:,.0f} tokens/s); "
        f"{doc['jobs_counted']} of {len(doc['jobs'])} jobs run through the window"
    )
    if "requested_kw" in doc:
        verdict = "feasible" if doc["requested_feasible"] else "[red]not feasible[/]"
        console.print(
            f"requested {doc['requested_kw']:.1f} kW: {verdict}, losing "
            f"{doc['requested_throughput_loss']:,.0f} tokens/s"
        )


def show_simulation(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(
        title=(
            f"tokens/s per job: {doc['workloads']} workloads x {doc['jobs']} jobs, "
            f"{doc['mix']} mix, PFI {doc['pfi_source']}, seed {doc['seed']}"
        )
    )
    for name in ("reduction", "equal", "pfi", "optimal", "oracle", "pfi closes", "optimal closes"):
        table.add_column(name, justify="right")
    for r in doc["results"]:
        by, closed = r["tokens_per_s_per_job"], r["gap_closed"]
        table.add_row(
            f"{r['reduction']:.0%}",
            *(f"{by[s]:,.0f}" for s in ("equal", "pfi", "optimal", "oracle")),
            *("-" if closed[s] is None else f"{closed[s]:.1%}" for s in ("pfi", "optimal")),
        )
    console.print(table)
    p = doc["predictor"]
    console.print(
        f"PFI predictor (DRAM copy product, {p['samples']} job types): LOO R^2 {p['loo_r2']:.2f}, "
        f"leave-one-group-out R^2 {p['logo_r2']:.2f}; predicted-PFI error RMSE "
        f"{doc['pfi_error_rmse']:.2f}"
    )
    if "plot" in doc:
        console.print(f"plot: {doc['plot']}")


def show_sync_check(doc: dict[str, Any]) -> None:
    console = Console()
    table = Table(
        title=(
            f"loop delay {doc['delay_s']:g} s, window {doc['window_s']:g} s on jobs of period "
            f"{doc['period_s']:g} s, duty {doc['duty']:g}"
            + (f" (worst job: {doc['worst_job']})" if "worst_job" in doc else "")
        )
    )
    for name in ("m", "weight", "significant", "coupling /s", "attractive", "critical /s"):
        table.add_column(name, justify="right")
    for h in doc["harmonics"]:
        crit = h["critical_coupling_per_s"]
        table.add_row(
            str(h["m"]),
            f"{h['weight']:.4f}",
            "yes" if h["significant"] else "no",
            f"{h['coupling_per_s']:+.4f}",
            "[red]yes[/]" if h["attractive"] else "no",
            "-" if crit is None else f"{crit:.4f}",
        )
    console.print(table)
    colour = {"safe": "green", "at-risk": "yellow", "unsafe": "red"}[doc["verdict"]]
    fleet = "fleet_max_safe_delay_s" in doc  # with a job mix: the bound every job keeps
    limit = doc["fleet_max_safe_delay_s"] if fleet else doc["max_safe_delay_s"]
    console.print(
        f"verdict: [{colour}]{doc['verdict']}[/]; in phase stable for two jobs: "
        f"{'yes' if doc['in_phase_stable'] else 'no'}; "
        + ("every job is " if fleet else "")
        + ("safe at any delay" if limit is None else f"safe below a delay of {limit:.3g} s")
    )
    for job in doc.get("jobs", []):
        if job["verdict"] != "safe":
            console.print(f"  {job['id']}: {job['verdict']} (harmonic {job['worst_m']})")
    if doc.get("advice"):
        console.print("what to do (any one of these makes it safe; docs/sync.md):")
        for line in doc["advice"]:
            console.print(f"  - {line}")


def show_sync_run(doc: dict[str, Any]) -> None:
    final = doc["final"]
    line = (
        f"{doc['jobs']} jobs, period {doc['period_s']:g} s, duty {doc['duty']:g}, delay "
        f"{doc['delay_s']:g} s over {doc['duration_s']:g} s: r1 {final['r1']:.2f}, "
        f"r2 {final['r2']:.2f}, r3 {final['r3']:.2f}; aggregate swing "
        f"{doc['aggregate_swing_ratio']:.2f}x the incoherent one"
    )
    if "phase_difference" in final:
        line += f"; phase difference {final['phase_difference']:.2f} rad"
    Console().print(line)
    if "plot" in doc:
        Console().print(f"plot: {doc['plot']}")


def show_pfi(doc: dict[str, Any]) -> None:
    console = Console()
    grid = ", ".join(f"{c:g}" for c in doc["grid_w"])
    console.print(
        f"PFI [bold]{doc['pfi']:.3f}[/] +- {doc['pfi_stderr']:.3f} over {doc['points']} points "
        f"on caps {{{grid}}} W (uncapped: {max(doc['grid_w']):g} W); Eq. 1 on the points as "
        f"measured: {doc['pfi_measured']:.3f}; noise {100 * doc['noise_fraction']:.2g}% a point"
    )
    for point in doc["set_aside"]:
        console.print(f"set aside: {point['cap_w']:g} W: {point['reason']}")


def show_trace(doc: dict[str, Any]) -> None:
    console = Console()
    console.print(
        f"{doc['samples']} samples over {doc['span_s']:.1f} s (every {doc['sample_interval_s']:.3g}"
        f" s, {100 * doc['missing_share']:.1f}% missing), mean {doc['mean_power_w']:.1f} W"
    )
    if doc["period_s"] is None:
        console.print(f"no period: {doc['no_period']}")
        return
    phase = "unknown" if doc["phase_rad"] is None else f"{doc['phase_rad']:.2f} rad"
    console.print(
        f"period [bold]{doc['period_s']:.3f} s[/], duty {doc['duty']:.3f}, levels "
        f"{doc['compute_w']:.1f} / {doc['comm_w']:.1f} W, phase at the end {phase}, "
        f"confidence {doc['confidence']:.2f}, paused {100 * doc['paused_share']:.1f}%"
    )
