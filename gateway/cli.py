"""The `flexgate` command line (CONTRACT.md, "Command line").

Every data command takes `--json` and then prints one JSON document on stdout. Exit codes: 0 on
success (an infeasible request is a valid answer), 2 on bad input with a one-line message on
stderr, 1 on other failures. Bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

from flexmodel.allocate import OBJECTIVES, allocate_mix
from flexmodel.errors import FlexModelError
from flexmodel.jobs import JobMix, parse_job_mix
from flexmodel.pfi import pfi_of_sweep


class BadInputError(Exception):
    """Input the user can fix: exit 2 with the message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        command: Callable[[argparse.Namespace], int] = args.command
        return command(args)
    except (BadInputError, FlexModelError) as exc:
        print(f"flexgate {args.name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last line of defence for a user: a message, not a traceback
        print(f"flexgate {args.name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flexgate", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_Parser)

    pfi = sub.add_parser("pfi", help="PFI of a measured sweep (CSV or JSON)")
    pfi.add_argument("sweep", type=Path, metavar="SWEEP")
    pfi.add_argument("--json", action="store_true", help="print one JSON document")
    pfi.set_defaults(command=_cmd_pfi, name="pfi")

    alloc = sub.add_parser("allocate", help="per-job caps for a facility-level reduction")
    alloc.add_argument("jobs", type=Path, metavar="JOBS", help="job-mix JSON file")
    amount = alloc.add_mutually_exclusive_group(required=True)
    amount.add_argument("--reduction-kw", type=_finite, metavar="R", help="at the meter [kW]")
    amount.add_argument(
        "--reduction-fraction",
        type=_finite,
        metavar="F",
        help="fraction of the mix's GPU-attributable facility power (k x baseline GPU kW)",
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
    alloc.set_defaults(command=_cmd_allocate, name="allocate")
    return parser


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# --- commands ----------------------------------------------------------------------------


def _cmd_pfi(args: argparse.Namespace) -> int:
    points = read_sweep(args.sweep)
    result = pfi_of_sweep(points, name=str(args.sweep))
    doc = {"pfi": result.pfi, "grid_w": list(result.grid_w), "points": result.points}
    if args.json:
        _print_json(doc)
    else:
        grid = ", ".join(f"{c:g}" for c in result.grid_w)
        Console().print(
            f"PFI [bold]{result.pfi:.3f}[/] over {result.points} points on caps {{{grid}}} W "
            f"(uncapped: {max(result.grid_w):g} W)"
        )
    return 0


def _cmd_allocate(args: argparse.Namespace) -> int:
    mix = read_job_mix(args.jobs)
    if args.reduction_kw is not None:
        if args.reduction_kw < 0:
            raise BadInputError(f"--reduction-kw must be at least 0, got {args.reduction_kw:g}")
        facility_kw = args.reduction_kw
    else:
        if args.reduction_fraction < 0:
            raise BadInputError(
                f"--reduction-fraction must be at least 0, got {args.reduction_fraction:g}"
            )
        facility_kw = args.reduction_fraction * gpu_attributable_kw(mix)
    doc = allocate_mix(mix, facility_kw, strategy=args.strategy, objective=args.objective)
    if args.reduction_fraction is not None:
        doc["reduction_fraction"] = args.reduction_fraction
    if args.json:
        _print_json(doc)
    else:
        _show_allocation(doc, mix)
    return 0


def gpu_attributable_kw(mix: JobMix) -> float:
    """`k` times the mix's uncapped GPU power [kW]."""
    gpu_kw = sum(j.gpus * j.power_w for j in mix.jobs) / 1000.0
    return mix.overhead_factor * gpu_kw


# --- input -------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BadInputError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except ValueError as exc:
        raise BadInputError(f"{path}: {exc}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_job_mix(path: Path) -> JobMix:
    try:
        return parse_job_mix(read_json(path))
    except FlexModelError as exc:
        raise BadInputError(f"{path}: {exc}") from None


def read_sweep(path: Path) -> list[tuple[float, float, float]]:
    """A sweep from CSV (`cap_w,power_w,throughput`) or JSON (`{"points": [...]}`)."""
    if path.suffix.lower() == ".json":
        doc = read_json(path)
        if (
            not isinstance(doc, dict)
            or set(doc) != {"points"}
            or not isinstance(doc["points"], list)
        ):
            raise BadInputError(
                f'{path}: expected {{"points": [{{"cap_w", "power_w", "throughput"}}, ...]}}'
            )
        rows = doc["points"]
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or set(row) != {"cap_w", "power_w", "throughput"}:
                raise BadInputError(
                    f"{path}: points[{i}] must have exactly cap_w, power_w, throughput"
                )
        return [_point(row, f"{path}: points[{i}]") for i, row in enumerate(rows)]
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in (reader.fieldnames or [])]
            if header != ["cap_w", "power_w", "throughput"]:
                raise BadInputError(
                    f"{path}: CSV header must be cap_w,power_w,throughput, got {','.join(header)}"
                )
            return [_point(row, f"{path}: line {i + 2}") for i, row in enumerate(reader)]
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError, csv.Error) as exc:
        raise BadInputError(f"{path}: cannot read: {exc}") from None


def _point(row: dict[str, Any], where: str) -> tuple[float, float, float]:
    values = []
    for name in ("cap_w", "power_w", "throughput"):
        raw = row.get(name)
        try:
            value = float(raw) if not isinstance(raw, bool) and raw is not None else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "throughput"):
            raise BadInputError(f"{where}: {name} must be a finite positive number, got {raw!r}")
        values.append(value)
    return values[0], values[1], values[2]


# --- output ------------------------------------------------------------------------------


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")


def _show_allocation(doc: dict[str, Any], mix: JobMix) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
