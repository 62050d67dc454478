"""`flexgate pfi`: the PFI of a measured sweep (CSV or JSON), with its noise and the points
set aside."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError, read_sweep
from flexmodel.sweeps import DEFAULT_NOISE, MAX_NOISE, MeasuredSweep, fit_sweep


def add_parser(sub: Any) -> None:
    pfi = sub.add_parser("pfi", help="PFI of a measured sweep (CSV or JSON)")
    pfi.add_argument(
        "sweep",
        type=Path,
        metavar="SWEEP",
        help="CSV with header cap_w,power_w,throughput (W, W, tokens/s), or JSON with the same "
        "points; the highest cap is the uncapped run",
    )
    pfi.add_argument(
        "--noise",
        type=options.noise,
        default=DEFAULT_NOISE,
        metavar="F",
        help="one point's measurement noise, a fraction of its throughput and power (default "
        f"{DEFAULT_NOISE:g}); the sweep's own scatter raises it, up to {MAX_NOISE:g}",
    )
    pfi.add_argument("--json", action="store_true", help="print one JSON document")
    pfi.set_defaults(command=run_pfi, name="pfi")


def run_pfi(args: argparse.Namespace) -> int:
    sweep = fit_sweep(read_sweep(args.sweep), name=str(args.sweep), noise=args.noise)
    if sweep.pfi is None:
        raise BadInputError(
            f"{args.sweep}: no cap slowed the job beyond the measurement noise "
            f"({100 * sweep.noise_fraction:.2g}% a point), so it has no PFI; set aside: "
            + "; ".join(f"{p.cap_w:g} W ({p.reason})" for p in sweep.set_aside)
        )
    doc = pfi_document(sweep)
    if args.json:
        output.print_json(doc)
    else:
        output.show_pfi(doc)
    return 0


def pfi_document(sweep: MeasuredSweep) -> dict[str, Any]:
    """`flexgate pfi --json`: the contract's `pfi`, `grid_w`, `points`, then the noise."""
    return {
        "pfi": sweep.pfi,
        "grid_w": list(sweep.grid_w),
        "points": len(sweep.grid_w),
        "pfi_stderr": sweep.pfi_stderr,
        "pfi_measured": sweep.pfi_measured,
        "noise_fraction": sweep.noise_fraction,
        "power_noise_fraction": sweep.power_noise_fraction,
        "throughput_noise_fraction": sweep.throughput_noise_fraction,
        "repeats": sweep.repeats,
        "out_of_order": [
            {"cap_w": p.cap_w, "power_w": p.power_w, "throughput": p.throughput, "reason": p.reason}
            for p in sweep.out_of_order
        ],
        "set_aside": [
            {"cap_w": p.cap_w, "power_w": p.power_w, "throughput": p.throughput, "reason": p.reason}
            for p in sweep.set_aside
        ],
        "fit": [
            {"cap_w": float(c), "power_w": float(p), "throughput": float(t)}
            for c, p, t in zip(sweep.cap_w, sweep.fit_power_w, sweep.fit_throughput, strict=True)
        ],
    }
