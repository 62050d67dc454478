"""`flexgate quote`: the supply curve, achievable and firm kW of a job mix."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexgate.cli import options, output
from flexgate.cli.readers import read_job_mix
from flexmodel.quote import DEFAULT_CONFIDENCE, DEFAULT_WINDOW_S, quote


def add_parser(sub: Any) -> None:
    verb = sub.add_parser("quote", help="supply curve, achievable and firm kW of a job mix")
    verb.add_argument("jobs", type=Path, metavar="JOBS", help="job-mix JSON file")
    verb.add_argument(
        "--reduction-kw", type=options.finite, metavar="R", help="price this reduction [kW]"
    )
    verb.add_argument(
        "--window-s",
        type=options.finite,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="how long the reduction must hold [s] (default 3600)",
    )
    verb.add_argument(
        "--confidence",
        type=options.fraction,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="probability that firm kW can be delivered (default 0.9)",
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=run_quote, name="quote")


def run_quote(args: argparse.Namespace) -> int:
    mix = read_job_mix(args.jobs)
    doc = quote(
        mix, window_s=args.window_s, confidence=args.confidence, reduction_kw=args.reduction_kw
    )
    if args.json:
        output.print_json(doc)
    else:
        output.show_quote(doc)
    return 0
