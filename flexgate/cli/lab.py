"""`flexgate lab`: the whole chain on loopback (mock VTN, gateway, agents), or one of the
scenarios that show the site loop phase-locking jobs (lock) or a frequency dip (fast).

The lab's modules load when the verb runs: the parser is built for every command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

from flexgate.cli import options
from flexgate.cli.environment import refuse_unknown_environment
from flexgate.cli.readers import BadInputError


def add_parser(sub: Any) -> None:
    lab = sub.add_parser("lab", help="the whole chain on loopback: mock VTN, gateway, agents")
    _add_site_and_event(lab)
    lab.add_argument(
        "--scenario",
        choices=("event", "lock", "fast"),
        default="event",
        help="event: the VTN's curtailment through the whole chain (default); lock: 64 jobs "
        "phase-locked by an unsafe site loop, kept apart by the default loop, unlocked by "
        "phase scattering (docs/sync.md, 'The lock lab'); fast: a frequency dip to 49.6 Hz "
        "held --duration s (default 4) fires the armed fast plans by the droop (docs/fast.md)",
    )
    lab.add_argument(
        "--out",
        type=Path,
        default=Path("out"),
        metavar="DIR",
        help="folder for the plot and the report (default out)",
    )
    _add_event_lab_options(lab)
    lab.set_defaults(command=run_lab, name="lab")


def _add_site_and_event(lab: Any) -> None:
    """The simulated site's size, and how much and how long the event asks of it."""
    lab.add_argument(
        "--nodes",
        type=options.positive_int,
        default=4,
        metavar="N",
        help="simulated GPU nodes (default 4)",
    )
    lab.add_argument(
        "--gpus-per-node",
        type=options.positive_int,
        default=8,
        metavar="G",
        help="GPUs per node, one job per node (default 8)",
    )
    lab.add_argument(
        "--reduction",
        type=options.fraction,
        default=0.25,
        metavar="F",
        help="share of the GPU-attributable facility power the VTN asks for (default 0.25)",
    )
    lab.add_argument(
        "--duration",
        type=options.positive,
        default=None,
        metavar="S",
        help="how long the event holds the reduction [s] (default 40); with --scenario lock, "
        "how long the unsafe loop runs (default 120; the default loop runs half of it, "
        "scattering one and a half times it)",
    )


def _add_event_lab_options(lab: Any) -> None:
    """The event scenario's own options: the others refuse them (`_refuse_event_options`)."""
    lab.add_argument(
        "--mismatch",
        action="store_true",
        help="the agents and the meter run a truth drawn away from the declared mix; the "
        "event runs open loop, then closed loop at the meter (give it --duration 60 or more)",
    )
    lab.add_argument(
        "--openadr",
        choices=("2.0b", "3.1"),
        default="2.0b",
        help="the OpenADR version of the mock VTN and the VEN (default 2.0b)",
    )
    lab.add_argument(
        "--characterise",
        action="store_true",
        help="the gateway is told no PFIs: every job is probed before the event, and the "
        "report compares the estimates with the truth and the event with an oracle plan",
    )
    lab.add_argument(
        "--meter-dead-s",
        type=options.non_negative,
        default=0.0,
        metavar="S",
        help="the lab meter's own transport delay before it shows any of a step (a BMS or "
        "SCADA hop) [s]; the gateway is told it, as a calibration would identify it (default 0)",
    )
    lab.add_argument(
        "--fault",
        type=_meter_fault,
        default=None,
        metavar="KIND@S",
        help="a meter fault S seconds into the event: meter-freeze@S (the reading holds, its "
        "answers stay fresh; meter-freeze:KW@S holds KW off it), meter-dropout@S (it stops "
        "answering) or meter-offset:KW@S (it reads KW off the truth)",
    )


def _meter_fault(text: str) -> Any:
    from flexgate.lab.meter import parse_fault

    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--fault {text!r}: ")) from None


def run_lab(args: argparse.Namespace) -> int:
    refuse_unknown_environment()
    if args.scenario == "lock":
        return _run_lock_lab(args)
    if args.scenario == "fast":
        return _run_fast_lab(args)
    from flexgate.lab.run import run_lab

    return run_lab(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        reduction=args.reduction,
        duration_s=args.duration or 40.0,
        out=args.out,
        mismatch=args.mismatch,
        openadr=args.openadr,
        characterise=args.characterise,
        meter_dead_s=args.meter_dead_s,
        fault=args.fault,
    )


def _refuse_event_options(args: argparse.Namespace, scenario: str) -> None:
    """The event lab's own options, refused (exit 2) by a scenario they do not apply to."""
    if (
        args.mismatch
        or args.openadr != "2.0b"
        or args.characterise
        or args.meter_dead_s
        or args.fault is not None
    ):
        raise BadInputError(
            f"{scenario}: --mismatch, --openadr, --characterise, --meter-dead-s and --fault "
            "do not apply to it"
        )


def _run_lock_lab(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from flexgate.lab.lock import run_lock
    from flexgate.lab.report import lock_report

    _refuse_event_options(
        args, "--scenario lock runs its own 64 jobs under the gateway's loop on a simulated clock"
    )
    console = Console()
    lock_s = args.duration or 120.0
    folder = Path(tempfile.mkdtemp(prefix="flexgate-lock-"))
    try:
        result = run_lock(
            lock_s=lock_s,
            default_s=lock_s / 2,
            scatter_s=1.5 * lock_s,
            folder=folder,
            say=lambda line: console.print(f"[dim]{line}[/]"),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return lock_report(result, args.out, console)


def _run_fast_lab(args: argparse.Namespace) -> int:
    from flexgate.lab.fast import fast_report, run_fast

    _refuse_event_options(
        args, "--scenario fast plays a frequency dip into the gateway's frequency trigger"
    )
    console = Console()
    hold_s = args.duration or 4.0
    result = run_fast(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        low_hz=49.6,
        hold_s=hold_s,
        say=lambda line: console.print(f"[dim]{line}[/]"),
    )
    return fast_report(result, hold_s, args.out, console)
