"""Figures for people: PNG files written with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # the backend must be chosen before pyplot loads
from matplotlib.figure import Figure

STRATEGY_STYLE = {
    "equal": ("tab:gray", "equal (DVFS fair)"),
    "pfi": ("tab:blue", "pfi (study's heuristic)"),
    "optimal": ("tab:green", "optimal (from PFI)"),
    "oracle": ("black", "oracle (true curves)"),
}


def plot_simulation(doc: dict[str, Any], path: Path) -> None:
    """Tokens/s per job against reduction for every strategy, and the share of the gap closed."""
    results = doc["results"]
    x = [100 * r["reduction"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for name, (colour, label) in STRATEGY_STYLE.items():
        y = [r["tokens_per_s_per_job"][name] / 1000 for r in results]
        left.plot(x, y, "o--" if name == "oracle" else "o-", color=colour, label=label)
    left.set(
        xlabel="power reduction [% of uncapped GPU power]",
        ylabel="tokens/s per job [thousands]",
        title="Throughput kept",
    )
    left.legend(frameon=False)
    left.grid(alpha=0.3)
    for name in ("pfi", "optimal"):
        colour, label = STRATEGY_STYLE[name]
        pts = [
            (xi, 100 * r["gap_closed"][name])
            for xi, r in zip(x, results, strict=True)
            if r["gap_closed"][name] is not None
        ]
        if pts:
            right.plot(*zip(*pts, strict=True), "o-", color=colour, label=label)
    right.axhline(63, color="tab:blue", alpha=0.4, linestyle=":", label="study: pfi at 30%, 63%")
    right.set(
        xlabel="power reduction [% of uncapped GPU power]",
        ylim=(0, 105),
        ylabel="equal-to-oracle gap closed [%]",
        title="Gap closed",
    )
    right.legend(frameon=False, loc="lower right")
    right.grid(alpha=0.3)
    fig.suptitle(
        f"{doc['workloads']} workloads x {doc['jobs']} jobs, {doc['mix']} mix, "
        f"PFI {doc['pfi_source']}, seed {doc['seed']}"
    )
    _save(fig, path)


def plot_sync(run: Any, path: Path) -> None:
    """The aggregate swing per period and the order parameters r1, r3 over a run."""
    _save(sync_figure(run), path)


def sync_figure(run: Any) -> Figure:
    """`plot_sync`'s figure, every trace in a legend that says what it means."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, constrained_layout=True)
    # Per period: the aggregate's standard deviation against the incoherent sqrt(N) one.
    per = round(run.period_s / run.dt_s)
    usable = len(run.aggregate) // per * per
    chunks = run.aggregate[:usable].reshape(-1, per)
    single = run.swing_single
    t = (np.arange(chunks.shape[0]) + 0.5) * per * run.dt_s
    top.plot(
        t,
        np.sqrt(run.jobs) * chunks.std(axis=1) / single,
        color="tab:orange",
        lw=1.0,
        label="the site's power swing, per iteration period",
    )
    top.axhline(1.0, color="grey", ls=":", label="independent jobs (1)")
    top.axhline(
        np.sqrt(run.jobs),
        color="tab:red",
        ls=":",
        label=f"locked (sqrt N = {np.sqrt(run.jobs):.1f})",
    )
    top.legend(frameon=True, framealpha=0.9, loc="best", fontsize="small")
    top.set(
        ylabel="site power swing\n(1 = independent jobs)",
        title=(
            f"{run.jobs} jobs, T = {run.period_s:g} s, duty {run.duty:g}, delay {run.delay_s:g} s, "
            f"gain {run.gain_per_s:g} rad/s, spread {run.spread:g}"
        ),
    )
    top.grid(alpha=0.3)
    meaning = {
        1: "r1: how far the jobs' iterations line up (1: all in step, 0: spread evenly)",
        3: "r3: the same for three groups a third of a period apart (3-cluster locking)",
    }
    for m, colour in ((1, "black"), (3, "tab:purple")):
        bottom.plot(run.time_s, run.order[:, m - 1], color=colour, lw=1.0, label=meaning[m])
    bottom.set(xlabel="time [s]", ylabel="order parameter (0 to 1)", ylim=(0, 1.05))
    bottom.legend(frameon=True, framealpha=0.9, loc="best", fontsize="small")
    bottom.grid(alpha=0.3)
    return fig


def plot_lab(
    trace: list[tuple[float, float, float, str]],
    requested_kw: float,
    path: Path,
) -> None:
    """Site power over a lab run: the baseline, the event shaded, the target inside it."""
    _save(lab_figure(trace, requested_kw), path)


def lab_figure(trace: list[tuple[float, float, float, str]], requested_kw: float) -> Figure:
    """`plot_lab`'s figure."""
    fig, ax = plt.subplots(figsize=(10, 5.2), constrained_layout=True)
    if trace:
        t, kw, target, status = (np.array(c) for c in zip(*trace, strict=True))
        active = status == "active"
        # Outside the event the target is the baseline; inside it, the baseline less the request.
        baseline = np.where(active, target + requested_kw, target)
        if active.any():
            start, end = t[active][0], t[active][-1]
            ax.axvspan(
                start, end, color="tab:orange", alpha=0.12, label="event (the VTN's request)"
            )
            ax.step(
                t[active],
                target[active],
                where="post",
                color="tab:red",
                ls="--",
                label=f"target: baseline - {requested_kw:.1f} kW",
            )
        ax.step(
            t,
            baseline,
            where="post",
            color="grey",
            ls=":",
            label="baseline: site power before the event (uncapped)",
        )
        ax.plot(
            t,
            kw,
            color="tab:blue",
            lw=1.5,
            label=(
                "site power at the facility meter (without a meter: the GPU power the agents\n"
                "report x k, the facility kW per GPU kW for conversion losses and cooling)"
            ),
        )
    ax.set(
        xlabel="time since the lab started [s]",
        ylabel="facility power [kW]",
        title=f"flexgate lab: the VTN asks the site to shed {requested_kw:.1f} kW",
    )
    # Below the axes: inside, it would hide the event, where the reader looks.
    ax.legend(
        frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize="small"
    )
    ax.grid(alpha=0.3)
    return fig


def plot_lock(runs: list[Any], threshold: float, path: Path) -> None:
    """The lock lab's three runs: r1..r3 over time, site power, and its spectrum."""
    _save(lock_figure(runs, threshold), path)


def lock_figure(runs: list[Any], threshold: float) -> Figure:
    """`plot_lock`'s figure: per run (`flexgate.lab.lock.LockRun`) the order parameters over
    time against the Rayleigh threshold and the facility power; below, the three spectra."""
    from flexgate.lab.lock import spectrum  # the lab's own computation, not repeated here

    fig = plt.figure(figsize=(14, 10), constrained_layout=True)
    grid = fig.add_gridspec(3, len(runs))
    colours = ("black", "tab:orange", "tab:purple")
    spectra = fig.add_subplot(grid[2, :])
    for col, (run, colour) in enumerate(
        zip(runs, ("tab:red", "tab:green", "tab:blue"), strict=False)
    ):
        t = np.asarray(run.time_s) - run.time_s[0]
        order = np.asarray(run.order)
        top = fig.add_subplot(grid[0, col])
        for m in range(3):
            top.plot(t, order[:, m], color=colours[m], lw=1.0, label=f"r{m + 1}")
        top.axhline(
            threshold, color="grey", ls="--", lw=1.0, label=f"Rayleigh threshold {threshold:.2f}"
        )
        top.set(
            title=run.name, xlabel="time in the run [s]", ylabel="order parameter", ylim=(0, 1.05)
        )
        top.legend(fontsize="small", loc="upper left")
        top.grid(alpha=0.3)
        middle = fig.add_subplot(grid[1, col])
        middle.plot(t, run.facility_kw, color=colour, lw=0.6)
        middle.set(xlabel="time in the run [s]", ylabel="facility power, true [kW]")
        middle.grid(alpha=0.3)
        start = int(len(run.facility_kw) * 0.5)
        freq, density = spectrum(run.facility_kw[start:])
        spectra.semilogy(freq[1:], density[1:], color=colour, lw=1.0, label=run.name)
    spectra.set(
        xlabel="frequency [Hz] (the jobs iterate at 0.5 Hz)",
        ylabel="site power spectral density [kW^2/Hz]",
        title="site power spectrum over each run's second half",
    )
    spectra.legend(fontsize="small")
    spectra.grid(alpha=0.3)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_fast(trace: list[tuple[float, float, float]], path: Path) -> None:
    """The fast lab: the grid's frequency and the site's summed GPU power (instant, and its
    mean over the last second) against it."""
    t, hz, kw = (np.array(c) for c in zip(*trace, strict=True))
    fig, ax = plt.subplots(figsize=(10, 5.2), constrained_layout=True)
    ax.plot(t, hz, color="tab:red", lw=1.5, label="grid frequency [Hz]")
    ax.set(xlabel="time since the record started [s]", ylabel="frequency [Hz]")
    power = ax.twinx()
    mean = np.array([kw[(t > s - 1.0) & (t <= s)].mean() for s in t])
    power.plot(t, kw, color="tab:blue", lw=0.6, alpha=0.35, label="GPU power, instant [kW]")
    power.plot(t, mean, color="tab:blue", lw=1.8, label="GPU power, mean of the last 1 s [kW]")
    power.set_ylabel("the site's summed GPU power [kW]")
    lines = ax.get_lines() + power.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], frameon=False, loc="lower left")
    ax.set_title("flexgate lab: a frequency dip fires the armed fast plans")
    ax.grid(alpha=0.3)
    _save(fig, path)
