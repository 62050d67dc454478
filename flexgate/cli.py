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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from flexmodel.allocate import OBJECTIVES
from flexmodel.errors import FlexModelError
from flexmodel.jobs import JobMix, allocate_mix, parse_job_mix
from flexmodel.pfi import pfi_of_sweep
from flexmodel.quote import DEFAULT_CONFIDENCE, DEFAULT_WINDOW_S, quote
from flexmodel.simulate import DEFAULT_REDUCTIONS, PFI_SOURCES, simulate
from flexmodel.sync import DEFAULT_GAIN_PER_S, VERDICTS, analyse, finite_or_none, worst_verdict
from flexmodel.syncsim import THROTTLES, simulate_sync
from flexmodel.workload import MIX_NAMES


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

    quote = sub.add_parser("quote", help="supply curve, achievable and firm kW of a job mix")
    quote.add_argument("jobs", type=Path, metavar="JOBS", help="job-mix JSON file")
    quote.add_argument(
        "--reduction-kw", type=_finite, metavar="R", help="price this reduction [kW]"
    )
    quote.add_argument(
        "--window-s",
        type=_finite,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="how long the reduction must hold [s] (default 3600)",
    )
    quote.add_argument(
        "--confidence",
        type=_finite,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="probability that firm kW can be delivered (default 0.9)",
    )
    quote.add_argument("--json", action="store_true", help="print one JSON document")
    quote.set_defaults(command=_cmd_quote, name="quote")

    sim = sub.add_parser("simulate", help="the PFI study's scheduling experiment, all strategies")
    sim.add_argument("--workloads", type=_positive_int, default=500, metavar="W")
    sim.add_argument("--jobs", type=_positive_int, default=100, metavar="N")
    sim.add_argument("--mix", choices=MIX_NAMES, default="production")
    sim.add_argument(
        "--reductions",
        type=_fractions,
        default=list(DEFAULT_REDUCTIONS),
        metavar="LIST",
        help="comma-separated fractions in [0, 1) (default 0,0.1,0.2,0.3,0.4)",
    )
    sim.add_argument("--pfi-source", choices=PFI_SOURCES, default="predicted")
    sim.add_argument("--seed", type=_seed, default=1, metavar="N")
    sim.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG of the results")
    sim.add_argument("--json", action="store_true", help="print one JSON document")
    sim.set_defaults(command=_cmd_simulate, name="simulate")
    _add_sync(sub)

    agent = sub.add_parser("agent", help="run a GPU node agent (FLEXGATE_AGENT_* settings)")
    agent.add_argument("--backend", choices=("sim", "nvml"), help="simulated GPUs or NVML")
    agent.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    agent.add_argument("--port", type=int, help="port (default 9100)")
    agent.add_argument("--node-id", help="this node's name in the job mix (default: hostname)")
    agent.add_argument("--state-dir", type=Path, help="where original limits are saved")
    agent.add_argument("--gpus", type=_positive_int, help="simulated GPUs (default 8)")
    agent.add_argument("--job-mix", type=Path, help="job mix placing jobs on this node")
    agent.add_argument(
        "--lab", action="store_true", help="lab mode: a placeholder token is allowed"
    )
    agent.set_defaults(command=_cmd_agent, name="agent")

    gateway = sub.add_parser("gateway", help="run the gateway service (FLEXGATE_* settings)")
    gateway.add_argument("--host", help="address to bind (default 127.0.0.1)")
    gateway.add_argument("--port", type=int, help="port (default 8000)")
    gateway.add_argument("--lab", action="store_true", help="lab mode: placeholder tokens allowed")
    gateway.set_defaults(command=_cmd_gateway, name="gateway")

    lab = sub.add_parser("lab", help="the whole chain on loopback: mock VTN, gateway, agents")
    lab.add_argument("--nodes", type=_positive_int, default=4, metavar="N")
    lab.add_argument("--gpus-per-node", type=_positive_int, default=8, metavar="G")
    lab.add_argument(
        "--reduction",
        type=_fraction,
        default=0.25,
        metavar="F",
        help="share of the GPU-attributable facility power the VTN asks for (default 0.25)",
    )
    lab.add_argument("--duration", type=_positive, default=40.0, metavar="S", help="event length")
    lab.add_argument("--out", type=Path, default=Path("out"), help="where the plot goes")
    lab.set_defaults(command=_cmd_lab, name="lab")

    vtn = sub.add_parser("mock-vtn", help="an OpenADR 2.0b VTN (openleadr) issuing a scenario")
    vtn.add_argument("--scenario", type=Path, metavar="FILE", help="events to issue (JSON)")
    vtn.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    vtn.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    vtn.set_defaults(command=_cmd_mock_vtn, name="mock-vtn")
    return parser


def _add_sync(sub: Any) -> None:
    sync = sub.add_parser("sync", help="phase-locking: analysis and simulation")
    verbs = sync.add_subparsers(required=True, metavar="VERB", parser_class=_Parser)
    check = verbs.add_parser("check", help="coupling per harmonic, critical coupling, verdict")
    check.add_argument("--period-s", type=_positive, metavar="T", help="iteration period [s]")
    check.add_argument("--duty", type=_fraction, metavar="D", help="compute share, in (0, 1)")
    check.add_argument("--delay-s", type=_non_negative, required=True, metavar="TAU")
    check.add_argument(
        "--window-s",
        type=_non_negative,
        default=0.0,
        metavar="W",
        help="the loop's moving-average window [s] (default 0)",
    )
    check.add_argument(
        "--spread",
        type=_non_negative,
        default=0.0,
        metavar="F",
        help="half-width of the jobs' rate spread, as a fraction of the rate",
    )
    check.add_argument(
        "--gain-per-s",
        type=_non_negative,
        default=DEFAULT_GAIN_PER_S,
        metavar="K",
        help=f"coupling at the fundamental [rad/s] (default {DEFAULT_GAIN_PER_S})",
    )
    check.add_argument("--job-mix", type=Path, metavar="FILE", help="analyse every job of a mix")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.set_defaults(command=_cmd_sync_check, name="sync check")

    run = verbs.add_parser("simulate", help="integrate the delayed-throttle model")
    run.add_argument("--jobs", type=_positive_int, required=True, metavar="N")
    run.add_argument("--period-s", type=_positive, required=True, metavar="T")
    run.add_argument("--duty", type=_fraction, required=True, metavar="D")
    run.add_argument("--delay-s", type=_non_negative, required=True, metavar="TAU")
    run.add_argument("--window-s", type=_non_negative, default=0.0, metavar="W")
    run.add_argument("--spread", type=_non_negative, default=0.0, metavar="F")
    run.add_argument("--gain-per-s", type=_non_negative, default=DEFAULT_GAIN_PER_S, metavar="K")
    run.add_argument("--duration-s", type=_positive, default=600.0, metavar="S")
    run.add_argument(
        "--noise",
        type=_non_negative,
        default=0.0,
        metavar="SIGMA",
        help="phase noise [cycles per sqrt(s)]",
    )
    run.add_argument("--throttle", choices=THROTTLES, default="linear")
    run.add_argument("--seed", type=_seed, default=1, metavar="N")
    run.add_argument("--plot", type=Path, metavar="FILE", help="aggregate power and r1 over time")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(command=_cmd_sync_simulate, name="sync simulate")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _fractions(text: str) -> list[float]:
    values = [_finite(part) for part in text.split(",") if part.strip()]
    if not values or any(not 0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected fractions in [0, 1) separated by commas, got {text!r}"
        )
    return values


def _positive(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _finite(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a number strictly between 0 and 1, got {text!r}"
        )
    return value


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


def _cmd_quote(args: argparse.Namespace) -> int:
    mix = read_job_mix(args.jobs)
    doc = quote(
        mix, window_s=args.window_s, confidence=args.confidence, reduction_kw=args.reduction_kw
    )
    if args.json:
        _print_json(doc)
    else:
        _show_quote(doc)
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    _check_plot(args.plot)
    with _progress("simulating", MofNCompleteColumn()) as bar:
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
    return _finish(args, doc, "plot_simulation", doc, _show_simulation)


def _cmd_sync_check(args: argparse.Namespace) -> int:
    loop = {
        "delay_s": args.delay_s,
        "window_s": args.window_s,
        "spread": args.spread,
        "gain_per_s": args.gain_per_s,
    }
    if args.job_mix is None:
        if args.period_s is None or args.duty is None:
            raise BadInputError("--period-s and --duty are required without --job-mix")
        doc = analyse(args.period_s, args.duty, **loop).job_dict(0)
    else:
        doc = fleet_check(read_job_mix(args.job_mix), **loop)
    if args.json:
        _print_json(doc)
    else:
        _show_sync_check(doc)
    return 0


def fleet_check(mix: JobMix, **loop: float) -> dict[str, Any]:
    """Every job's verdict under one loop; the top level describes the worst job."""
    waving = [j for j in mix.jobs if 0.0 < j.duty < 1.0]
    if not waving:
        raise BadInputError("no job of the mix has a two-level waveform (every duty is 1)")
    result = analyse([j.period_s for j in waving], [j.duty for j in waving], **loop)
    verdicts = result.verdict
    index = {j.id: i for i, j in enumerate(waving)}
    worst = max(
        range(len(waving)), key=lambda i: (VERDICTS.index(verdicts[i]), -result.max_safe_delay_s[i])
    )
    doc = result.job_dict(worst)
    doc["worst_job"] = waving[worst].id
    doc["verdict"] = worst_verdict(verdicts)
    doc["jobs"] = [
        {"id": j.id, "verdict": "safe", "worst_m": None, "max_safe_delay_s": None}
        if j.id not in index
        else {
            "id": j.id,
            "verdict": verdicts[index[j.id]],
            "worst_m": int(result.worst_m[index[j.id]]),
            "max_safe_delay_s": finite_or_none(result.max_safe_delay_s[index[j.id]]),
        }
        for j in mix.jobs
    ]
    return doc


def _cmd_sync_simulate(args: argparse.Namespace) -> int:
    _check_plot(args.plot)
    with _progress("integrating") as bar:
        task = bar.add_task("run", total=1.0)
        run = simulate_sync(
            jobs=args.jobs,
            period_s=args.period_s,
            duty=args.duty,
            delay_s=args.delay_s,
            window_s=args.window_s,
            gain_per_s=args.gain_per_s,
            spread=args.spread,
            duration_s=args.duration_s,
            seed=args.seed,
            noise=args.noise,
            throttle=args.throttle,
            progress=lambda done: bar.update(task, completed=done),
        )
    return _finish(args, run.as_dict(), "plot_sync", run, _show_sync_run)


def _finish(
    args: argparse.Namespace,
    doc: dict[str, Any],
    plotter: str,
    data: Any,
    show: Callable[[dict[str, Any]], None],
) -> int:
    """Draw the plot when asked, then print the document (JSON or for people)."""
    if args.plot is not None:
        from flexgate import plots  # matplotlib costs 0.2 s: load it when asked

        getattr(plots, plotter)(data, args.plot)
        doc["plot"] = str(args.plot)
    if args.json:
        _print_json(doc)
    else:
        show(doc)
    return 0


def _cmd_agent(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agents.run import run_agent
    from agents.settings import AgentSettings

    given = {
        "agent_backend": args.backend,
        "agent_host": args.host,
        "agent_port": args.port,
        "agent_node_id": args.node_id,
        "agent_state_dir": args.state_dir,
        "agent_gpus": args.gpus,
        "agent_job_mix": args.job_mix,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    if args.lab:
        overrides["lab"] = True
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as exc:
        raise BadInputError(_first_error(exc)) from None
    if settings.agent_job_mix is not None:
        read_job_mix(settings.agent_job_mix)  # bad input is said before anything starts
    run_agent(settings)
    return 0


def _cmd_gateway(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.run import run_gateway
    from gateway.settings import GatewaySettings

    given = {"host": args.host, "port": args.port, "lab": True if args.lab else None}
    try:
        settings = GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise BadInputError(_first_error(exc)) from None
    run_gateway(settings)
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    from flexgate.lab import run_lab

    return run_lab(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        reduction=args.reduction,
        duration_s=args.duration,
        out=args.out,
    )


def _cmd_mock_vtn(args: argparse.Namespace) -> int:
    import time

    from flexgate.mockvtn import DEFAULT_SCENARIO, MockVtn, read_scenario

    try:
        scenario = read_scenario(args.scenario) if args.scenario else DEFAULT_SCENARIO
    except FileNotFoundError:
        raise BadInputError(f"{args.scenario}: no such file") from None
    except (ValueError, OSError) as exc:
        raise BadInputError(f"{args.scenario}: {exc}") from None
    vtn = MockVtn(
        scenario, host=args.host, port=args.port, say=lambda line: print(line, flush=True)
    ).start()
    print(f"mock VTN at {vtn.url}; waiting for a VEN (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(1)
    finally:
        vtn.stop()


def _first_error(exc: Any) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "__root__")
    message = str(error.get("msg", exc)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _progress(label: str, *columns: Any) -> Progress:
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


def _check_plot(path: Path | None) -> None:
    if path is not None and not path.parent.is_dir():
        raise BadInputError(f"--plot: folder {path.parent} does not exist")


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


def _show_quote(doc: dict[str, Any]) -> None:
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


def _show_simulation(doc: dict[str, Any]) -> None:
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


def _show_sync_check(doc: dict[str, Any]) -> None:
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
    limit = doc["max_safe_delay_s"]
    console.print(
        f"verdict: [{colour}]{doc['verdict']}[/]; in phase stable for two jobs: "
        f"{'yes' if doc['in_phase_stable'] else 'no'}; "
        + ("safe at any delay" if limit is None else f"safe below a delay of {limit:.3g} s")
    )
    for job in doc.get("jobs", []):
        if job["verdict"] != "safe":
            console.print(f"  {job['id']}: {job['verdict']} (harmonic {job['worst_m']})")


def _show_sync_run(doc: dict[str, Any]) -> None:
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


if __name__ == "__main__":
    sys.exit(main())
