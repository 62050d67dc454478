"""`flexgate allocate`: per-job caps for a facility-level reduction of a job mix."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError, read_job_mix
from flexmodel.allocate import allocate_mix
from flexmodel.problem import OBJECTIVES


def add_parser(sub: Any) -> None:
    alloc = sub.add_parser("allocate", help="per-job caps for a facility-level reduction")
    alloc.add_argument("jobs", type=Path, metavar="JOBS", help="job-mix JSON file")
    amount = alloc.add_mutually_exclusive_group(required=True)
    amount.add_argument(
        "--reduction-kw", type=options.finite, metavar="R", help="at the meter [kW]"
    )
    amount.add_argument(
        "--reduction-fraction",
        type=options.share,
        metavar="F",
        help="share in [0, 1] of the mix's GPU-attributable facility power (k x baseline GPU kW "
        "of the placed jobs); 0.25 is 25%%",
    )
    alloc.add_argument(
        "--strategy",
        choices=("equal", "pfi", "optimal"),
        default="optimal",
        help="how the cut is divided (default: optimal)",
    )
    alloc.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="throughput",
        help="what optimal maximises: summed tokens/s (default) or GPU-weighted fractions",
    )
    alloc.add_argument("--json", action="store_true", help="print one JSON document")
    alloc.set_defaults(command=run_allocate, name="allocate")


def run_allocate(args: argparse.Namespace) -> int:
    mix = read_job_mix(args.jobs)
    if args.reduction_kw is not None:
        if args.reduction_kw < 0:
            raise BadInputError(f"--reduction-kw must be at least 0, got {args.reduction_kw:g}")
        facility_kw = args.reduction_kw
    else:
        # Of the placed jobs only: the site can neither measure nor cap the others.
        facility_kw = args.reduction_fraction * mix.overhead_factor * mix.baseline_gpu_kw
    doc = allocate_mix(mix, facility_kw, strategy=args.strategy, objective=args.objective)
    if args.reduction_fraction is not None:
        doc["reduction_fraction"] = args.reduction_fraction
    if args.json:
        output.print_json(doc)
    else:
        output.show_allocation(doc, mix)
    return 0
