"""`flexgate trace`: the iteration period, duty, levels and phase of a recorded power trace."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError, read_trace
from flexmodel.errors import FlexModelError
from flexmodel.traces import TraceAnalysis, analyse_trace


def add_parser(sub: Any) -> None:
    trace = sub.add_parser(
        "trace", help="iteration period, duty, levels and phase of a recorded power trace"
    )
    trace.add_argument(
        "trace",
        type=Path,
        metavar="FILE",
        help="CSV with columns t_s,power_w (s, W; as NVML and DCGM loggers write), uneven "
        "sampling allowed",
    )
    trace.add_argument(
        "--min-period-s",
        type=options.positive,
        metavar="S",
        help="shortest period sought [s] (default: 4 sample intervals)",
    )
    trace.add_argument(
        "--max-period-s",
        type=options.positive,
        default=60.0,
        metavar="S",
        help="longest period sought [s] (default 60, at most the trace's span / 2.5)",
    )
    trace.add_argument(
        "--sensor-lag-s",
        type=float,
        default=0.0,
        metavar="S",
        help="the power sensor's effective lag [s] (0.1: an H200's instant field; 0.55: a 1 s "
        "average updated every 100 ms); the phase is corrected by it (default 0: as read)",
    )
    trace.add_argument("--json", action="store_true", help="print one JSON document")
    trace.set_defaults(command=run_trace, name="trace")


def run_trace(args: argparse.Namespace) -> int:
    times, power = read_trace(args.trace)
    try:
        if not (args.sensor_lag_s >= 0 and math.isfinite(args.sensor_lag_s)):
            raise BadInputError(
                f"--sensor-lag-s must be 0 or more seconds, got {args.sensor_lag_s}"
            )
        found = analyse_trace(
            times,
            power,
            min_period_s=args.min_period_s,
            max_period_s=args.max_period_s,
            sensor_lag_s=args.sensor_lag_s,
        )
    except FlexModelError as exc:
        raise BadInputError(f"{args.trace}: {exc}") from None
    doc = trace_document(found)
    if args.json:
        output.print_json(doc)
    else:
        output.show_trace(doc)
    return 0


def trace_document(found: TraceAnalysis) -> dict[str, Any]:
    """`flexgate trace --json`: nulls and `no_period` when the trace has no clear period."""
    wave = found.waveform
    return {
        "period_s": None if wave is None else wave.period_s,
        "duty": None if wave is None else wave.duty,
        "compute_w": None if wave is None else wave.compute_w,
        "comm_w": None if wave is None else wave.comm_w,
        "phase_rad": found.phase_rad,
        "confidence": 0.0 if wave is None else wave.confidence,
        "paused_share": None if wave is None else wave.paused_share,
        "no_period": found.no_period,
        "samples": found.samples,
        "span_s": found.span_s,
        "sample_interval_s": found.sample_interval_s,
        "missing_share": found.missing_share,
        "mean_power_w": found.mean_power_w,
    }
