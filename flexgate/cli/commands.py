"""The `flexgate` commands: each takes the parsed arguments and returns its exit code.

Inputs come through `flexgate.cli.readers`, answers go out through `flexgate.cli.output`;
what a command computes is flexmodel's (or, for the services, their own packages').
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from flexgate.cli import output
from flexgate.cli.readers import BadInputError, read_job_mix, read_sweep, read_trace
from flexmodel.allocate import allocate_mix
from flexmodel.errors import FlexModelError
from flexmodel.jobs import JobMix
from flexmodel.quote import quote
from flexmodel.simulate import simulate
from flexmodel.sweeps import MeasuredSweep, fit_sweep
from flexmodel.sync import VERDICTS, analyse, finite_or_none, worst_verdict
from flexmodel.syncsim import simulate_sync
from flexmodel.traces import TraceAnalysis, analyse_trace


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


def run_simulate(args: argparse.Namespace) -> int:
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
    return _finish(args, doc, "plot_simulation", doc, output.show_simulation)


def run_sync_check(args: argparse.Namespace) -> int:
    loop = {
        "delay_s": args.delay_s,
        "window_s": args.window_s,
        "hold_s": args.hold_s,
        "proportional_gain": args.proportional_gain,
        "integral_gain_per_s": args.integral_gain_per_s,
        "spread": args.spread,
        "gain_per_s": args.gain_per_s,
    }
    if args.job_mix is None:
        if args.period_s is None or args.duty is None:
            raise BadInputError("--period-s and --duty are required without --job-mix")
        periods = [args.period_s]

        def check(**changed: float) -> dict[str, Any]:
            return analyse(args.period_s, args.duty, **(loop | changed)).job_dict(0)
    else:
        mix = read_job_mix(args.job_mix)
        periods = [j.period_s for j in mix.waving]

        def check(**changed: float) -> dict[str, Any]:
            return fleet_check(mix, **(loop | changed))

    doc = check()
    doc["advice"] = loop_advice(check, doc, periods)
    if args.json:
        output.print_json(doc)
    else:
        output.show_sync_check(doc)
    return 0


#: Whole periods of a job tried as the loop's window when advising one.
ADVICE_WINDOW_PERIODS = (1, 2, 3, 4)


def loop_advice(
    check: Callable[..., dict[str, Any]], doc: dict[str, Any], periods: list[float]
) -> list[str]:
    """Loop settings that make an unsafe or at-risk loop safe, each checked by `check` (the
    same analysis with one setting changed): a verdict alone leaves an operator stuck."""
    if doc["verdict"] == "safe":
        return []
    advice = []
    limits = [j["max_safe_delay_s"] for j in doc.get("jobs", [doc])]
    limit = min((x for x in limits if x is not None), default=None)
    if limit is not None and limit > 0 and check(delay_s=0.95 * limit)["verdict"] == "safe":
        advice.append(
            f"a faster loop: --delay-s below {limit:.3g} s (the gateway's site loop: "
            "FLEXGATE_METER_PERIOD_S, the meter's FLEXGATE_METER_DEAD_S and _LAG_S, the plan "
            "and the agents' actuation)"
        )
    windows = sorted({round(k * p, 6) for p in periods for k in ADVICE_WINDOW_PERIODS})
    window = next((w for w in windows if check(window_s=w)["verdict"] == "safe"), None)
    if window is not None:
        advice.append(
            f"a loop that averages over whole iteration periods: --window-s {window:g} "
            "(it no longer sees the jobs' swings)"
        )
    if doc["spread"] == 0:
        advice.append(
            "--spread 0 means identical jobs, which lock under the weakest pull: give the "
            "jobs' real rate spread (a fraction, e.g. 0.01) for a verdict that fits them"
        )
    return advice


def fleet_check(mix: JobMix, **loop: float) -> dict[str, Any]:
    """Every job's verdict under one loop; the top level describes the worst job."""
    waving = mix.waving
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
    doc["jobs"] = jobs = [
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
    # The worst job's bound is not the fleet's: one line must not say "safe below 0.333 s"
    # while the advice asks for 0.25 s. Every job is safe below the smallest bound.
    bounds = [j["max_safe_delay_s"] for j in jobs if j["max_safe_delay_s"] is not None]
    doc["fleet_max_safe_delay_s"] = min(bounds, default=None)
    return doc


def run_sync_simulate(args: argparse.Namespace) -> int:
    _check_plot(args.plot)
    with _progress("integrating") as bar:
        task = bar.add_task("run", total=1.0)
        run = simulate_sync(
            jobs=args.jobs,
            period_s=args.period_s,
            duty=args.duty,
            delay_s=args.delay_s,
            window_s=args.window_s,
            hold_s=args.hold_s,
            proportional_gain=args.proportional_gain,
            integral_gain_per_s=args.integral_gain_per_s,
            gain_per_s=args.gain_per_s,
            spread=args.spread,
            duration_s=args.duration_s,
            seed=args.seed,
            noise=args.noise,
            throttle=args.throttle,
            progress=lambda done: bar.update(task, completed=done),
        )
    return _finish(args, run.as_dict(), "plot_sync", run, output.show_sync_run)


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
        output.print_json(doc)
    else:
        show(doc)
    return 0


def refuse_unknown_environment() -> None:
    """Every `FLEXGATE_*` variable must be a setting of the gateway or the agent (they often
    share one environment), or listed as not a setting: each program alone knows only its own
    names, so a misspelt agent prefix (FLEXGATE_AGNET_BACKEND) is caught here. Where only the
    agent is installed (`flexgate[agent]`: a GPU node) the gateway's names cannot be read, so
    only the agent's own namespace is judged."""
    import os

    from agents.protocol import AGENT_NAMESPACE, unknown_variables
    from agents.settings import AgentSettings

    known = [*AgentSettings.model_fields]
    try:
        from gateway.settings import GatewaySettings
    except ImportError:  # the gateway's extra is not installed

        def foreign(name: str) -> bool:
            return not name.startswith(AGENT_NAMESPACE)

        problem = unknown_variables(os.environ, known, foreign=foreign)
    else:
        problem = unknown_variables(os.environ, [*GatewaySettings.model_fields, *known])
    if problem:
        raise BadInputError(problem)


def run_agent_token(args: argparse.Namespace) -> int:
    """A node's own agent token, from FLEXGATE_NODE_TOKEN_SECRET (the gateway's site secret):
    set it as that node's FLEXGATE_AGENT_TOKEN."""
    import os

    from agents.protocol import MIN_TOKEN_CHARS, node_token

    secret = os.environ.get("FLEXGATE_NODE_TOKEN_SECRET", "")
    if len(secret) < 2 * MIN_TOKEN_CHARS:
        raise BadInputError(
            "FLEXGATE_NODE_TOKEN_SECRET must hold the site's secret (32+ characters), as the "
            "gateway's does"
        )
    if not args.node_id.strip() or args.node_id != args.node_id.strip():
        raise BadInputError(f"{args.node_id!r} is not a node id (the agent's --node-id)")
    token = node_token(secret, args.node_id)
    if args.json:
        output.print_json({"node_id": args.node_id, "token": token})
    else:
        print(token)
    return 0


def run_agent(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from agents.errors import InvalidSetupError, NoNvmlError
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
    refuse_unknown_environment()
    try:
        settings = AgentSettings(**overrides)
    except ValidationError as exc:
        raise BadInputError(_first_error(exc)) from None
    if args.restore:
        return restore_agent(settings)
    if settings.agent_job_mix is not None:
        read_job_mix(settings.agent_job_mix)  # bad input is said before anything starts
    try:
        run_agent(settings)
    except NoNvmlError as exc:
        raise BadInputError(f"{exc}: is this a GPU node with NVIDIA's driver?") from None
    except InvalidSetupError as exc:  # raised while the node is built, before it serves
        raise BadInputError(
            f"{exc} (set --gpus to the node's GPU count, or fix the job mix's placement)"
        ) from None
    return 0


def restore_agent(settings: Any) -> int:
    """`flexgate agent --restore`: one line per GPU; exit 1 when a GPU's restore failed."""
    from agents.errors import InvalidSetupError
    from agents.logs import show_on_stderr
    from agents.restore import RestoreFailedError, run_restore

    show_on_stderr()  # the restore's log line, with the agent's, in the unit's journal
    try:
        lines = run_restore(settings)
    except InvalidSetupError as exc:
        raise BadInputError(str(exc)) from None
    except RestoreFailedError as exc:
        print(f"flexgate agent --restore: failed: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def run_gateway(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.run import run_gateway
    from gateway.settings import GatewaySettings

    given = {"host": args.host, "port": args.port, "lab": True if args.lab else None}
    refuse_unknown_environment()
    try:
        settings = GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise BadInputError(_first_error(exc)) from None
    if not settings.agents.strip():
        # Not refused: a gateway may start before its agents are known (it answers quotes and
        # takes events), but one that silently caps nothing is the worse surprise.
        print(
            "flexgate gateway: warning: FLEXGATE_AGENTS is empty: no agent is known, so no GPU "
            "will be capped (set FLEXGATE_AGENTS=http://node-01:9100,... to the agents' URLs)",
            file=sys.stderr,
            flush=True,
        )
    run_gateway(settings)
    return 0


def run_lab(args: argparse.Namespace) -> int:
    refuse_unknown_environment()
    if args.scenario == "lock":
        return _run_lock_lab(args)
    if args.scenario == "fast":
        return _run_fast_lab(args)
    from flexgate.lab import run_lab

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

    from flexgate.labreport import lock_report
    from flexgate.locklab import run_lock

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
    from flexgate.fastlab import fast_report, run_fast

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


def run_mock_vtn(args: argparse.Namespace) -> int:
    import time

    if args.openadr == "3.1":
        return _run_mock_vtn31(args)
    if args.mqtt_broker:
        raise BadInputError("--mqtt-broker is for the 3.1 mock VTN (--openadr 3.1)")
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


def _run_mock_vtn31(args: argparse.Namespace) -> int:
    import time

    from flexgate.mockvtn31 import LAB_CLIENT_ID, MockVtn31
    from flexgate.serve import ServerThread

    if args.scenario:
        raise BadInputError("--scenario is a 2.0b scenario: the 3.1 mock VTN issues its own event")
    try:
        vtn = MockVtn31(say=lambda line: print(line, flush=True), mqtt_broker=args.mqtt_broker)
    except (ValueError, OSError) as exc:
        raise BadInputError(f"--mqtt-broker {args.mqtt_broker}: {exc}") from None
    vtn.issue_after_registration()
    mqtt = f"; MQTT notifications on {args.mqtt_broker}" if args.mqtt_broker else ""
    try:
        with ServerThread(vtn.app, host=args.host, port=args.port) as url:
            print(
                f"mock OpenADR 3.1 VTN at {url}; OAuth2 client {LAB_CLIENT_ID!r} with the lab "
                f"secret (docs/openadr.md){mqtt}; waiting for a VEN (Ctrl-C stops)",
                file=sys.stderr,
            )
            while True:
                time.sleep(1)
    finally:
        vtn.close()


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
