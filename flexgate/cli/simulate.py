"""`flexgate simulate`: the PFI study's scheduling experiment, every strategy on random job
mixes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import MofNCompleteColumn

from flexgate.cli import options, output
from flexmodel.simulate import DEFAULT_REDUCTIONS, PFI_SOURCES, simulate
from flexmodel.workload import MIX_NAMES


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="the PFI study's scheduling experiment, all strategies")
    sim.add_argument(
        "--workloads",
        type=options.positive_int,
        default=500,
        metavar="W",
        help="workloads (random job mixes) to average over (default 500, the study's)",
    )
    sim.add_argument(
        "--jobs",
        type=options.positive_int,
        default=100,
        metavar="N",
        help="jobs per workload (default 100)",
    )
    sim.add_argument(
        "--mix",
        choices=MIX_NAMES,
        default="production",
        help="job types: production (85%% fine-tuning jobs) or random (uniform over the study's "
        "25 types) (default production)",
    )
    sim.add_argument(
        "--reductions",
        type=options.fractions,
        default=list(DEFAULT_REDUCTIONS),
        metavar="LIST",
        help="comma-separated fractions in [0, 1) (default 0,0.1,0.2,0.3,0.4)",
    )
    sim.add_argument(
        "--pfi-source",
        choices=PFI_SOURCES,
        default="predicted",
        help="what the strategies know of each job's PFI: predicted from telemetry (with the "
        "study's error) or measured (default predicted)",
    )
    sim.add_argument(
        "--seed",
        type=options.seed,
        default=1,
        metavar="N",
        help="random seed, 0 or more (default 1)",
    )
    sim.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG of the results")
    sim.add_argument("--json", action="store_true", help="print one JSON document")
    sim.set_defaults(command=run_simulate, name="simulate")


def run_simulate(args: argparse.Namespace) -> int:
    output.check_plot(args.plot)
    with output.progress("simulating", MofNCompleteColumn()) as bar:
        task = bar.add_task("workloads", total=args.workloads)
        doc = simulate(
            workloads=args.workloads,
            jobs=args.jobs,
            mix=args.mix,
            reductions=args.reductions,
            pfi_source=args.pfi_source,
            seed=args.seed,
            progress=lambda done, _total: bar.update(task, completed=done),
        )
    return output.plot_and_print(args, doc, "plot_simulation", doc, output.show_simulation)
