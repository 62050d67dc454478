"""`flexgate sync check` and `flexgate sync simulate`: whether a site loop phase-locks its
jobs, what to change when it does, and the delayed-throttle model integrated over time."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexgate.cli import options, output
from flexgate.cli.readers import BadInputError, read_job_mix
from flexmodel.jobs import JobMix
from flexmodel.sync import DEFAULT_GAIN_PER_S, VERDICTS, analyse, finite_or_none, worst_verdict
from flexmodel.syncsim import THROTTLES, simulate_sync

#: Whole periods of a job tried as the loop's window when advising one.
ADVICE_WINDOW_PERIODS = (1, 2, 3, 4)


def add_parser(sub: Any) -> None:
    sync = sub.add_parser("sync", help="phase-locking: analysis and simulation")
    verbs = sync.add_subparsers(required=True, metavar="VERB", parser_class=options.Parser)
    _add_check(verbs)
    _add_simulate(verbs)


def _add_check(verbs: Any) -> None:
    check = verbs.add_parser("check", help="coupling per harmonic, critical coupling, verdict")
    check.add_argument(
        "--period-s", type=options.positive, metavar="T", help="iteration period [s]"
    )
    check.add_argument(
        "--duty", type=options.fraction, metavar="D", help="compute share, in (0, 1)"
    )
    _add_loop(check, spread_note="")
    check.add_argument("--job-mix", type=Path, metavar="FILE", help="analyse every job of a mix")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.set_defaults(command=run_sync_check, name="sync check")


def _add_simulate(verbs: Any) -> None:
    run = verbs.add_parser("simulate", help="integrate the delayed-throttle model")
    run.add_argument(
        "--jobs",
        type=options.positive_int,
        required=True,
        metavar="N",
        help="jobs sharing the loop",
    )
    run.add_argument(
        "--period-s", type=options.positive, required=True, metavar="T", help="iteration period [s]"
    )
    run.add_argument(
        "--duty", type=options.fraction, required=True, metavar="D", help="compute share, in (0, 1)"
    )
    _add_loop(run, spread_note=" (default 0)")
    run.add_argument(
        "--duration-s",
        type=options.positive,
        default=600.0,
        metavar="S",
        help="simulated time [s] (default 600)",
    )
    run.add_argument(
        "--noise",
        type=options.non_negative,
        default=0.0,
        metavar="SIGMA",
        help="phase noise [cycles per sqrt(s)]",
    )
    run.add_argument(
        "--throttle",
        choices=THROTTLES,
        default="linear",
        help="how the loop's output slows the jobs (default linear)",
    )
    run.add_argument(
        "--seed",
        type=options.seed,
        default=1,
        metavar="N",
        help="random seed, 0 or more (default 1)",
    )
    run.add_argument("--plot", type=Path, metavar="FILE", help="aggregate power and r1 over time")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(command=run_sync_simulate, name="sync simulate")


def _add_loop(verb: Any, spread_note: str) -> None:
    """The site loop both verbs judge: its delay and window, the jobs' rate spread, the
    coupling and the controller."""
    verb.add_argument(
        "--delay-s",
        type=options.non_negative,
        required=True,
        metavar="TAU",
        help="the loop's delay from measuring power to acting on it [s]",
    )
    verb.add_argument(
        "--window-s",
        type=options.non_negative,
        default=0.0,
        metavar="W",
        help="the loop's moving-average window [s] (default 0)",
    )
    verb.add_argument(
        "--spread",
        type=options.non_negative,
        default=0.0,
        metavar="F",
        help="half-width of the jobs' rate spread, as a fraction of the rate" + spread_note,
    )
    verb.add_argument(
        "--gain-per-s",
        type=options.non_negative,
        default=DEFAULT_GAIN_PER_S,
        metavar="K",
        help=f"coupling at the fundamental [rad/s] (default {DEFAULT_GAIN_PER_S})",
    )
    _add_controller(verb)


def _add_controller(verb: Any) -> None:
    """The loop's controller: sample-and-hold, proportional and integral gains."""
    verb.add_argument(
        "--hold-s",
        type=options.non_negative,
        default=0.0,
        metavar="TS",
        help="the loop acts every TS seconds, holding its output between (default 0)",
    )
    verb.add_argument(
        "--proportional-gain",
        type=options.non_negative,
        default=1.0,
        metavar="KP",
        help="proportional part of the controller, relative to --gain-per-s (default 1)",
    )
    verb.add_argument(
        "--integral-gain-per-s",
        type=options.non_negative,
        default=0.0,
        metavar="KI",
        help="integral part [1/s] (default 0: a proportional throttle; 0 with KP 0 is no loop)",
    )


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
    output.check_plot(args.plot)
    with output.progress("integrating") as bar:
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
    return output.plot_and_print(args, run.as_dict(), "plot_sync", run, output.show_sync_run)
