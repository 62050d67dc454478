"""The `flexgate` argument parser: every command, its options and their checks.

Options are checked as they are parsed (`_finite`, `_fraction`, ...), so a command starts only
with values it can use; a bad one exits 2 with argparse's one-line message.
"""

from __future__ import annotations

import argparse
import math
from datetime import date, datetime
from pathlib import Path
from typing import Any, NoReturn

from flexgate.cli import commands, doctor
from flexmodel.problem import OBJECTIVES
from flexmodel.quote import DEFAULT_CONFIDENCE, DEFAULT_WINDOW_S
from flexmodel.simulate import DEFAULT_REDUCTIONS, PFI_SOURCES
from flexmodel.sweeps import DEFAULT_NOISE, MAX_NOISE
from flexmodel.sync import DEFAULT_GAIN_PER_S
from flexmodel.syncsim import THROTTLES
from flexmodel.workload import MIX_NAMES

DESCRIPTION = (
    "flexgate: demand response for GPU data centres. The model commands (pfi, trace, allocate, "
    "quote, simulate, sync) read files and print answers; agent, gateway and mock-vtn run "
    "services; lab runs the whole chain on this machine; doctor checks a node or a gateway. "
    "Data commands take --json. Exit codes: 0 success, 2 bad input (one line on stderr), "
    "1 other failure. Documentation: docs/cli.md."
)
AGENT_EPILOG = """\
required: FLEXGATE_AGENT_TOKEN, the bearer token the gateway sends with caps (16+ characters;
  --lab allows none), and --backend (nvml on a GPU node, sim for simulated GPUs; --lab: sim).
  Options override the FLEXGATE_AGENT_* variables (docs/configuration.md).
two agents on one host need their own --port and --node-id:
  flexgate agent --lab --node-id node-01 --port 9101
  flexgate agent --lab --node-id node-02 --port 9102"""
GATEWAY_EPILOG = """\
required: FLEXGATE_API_TOKEN (callers' bearer token for every change) and FLEXGATE_AGENT_TOKEN
  (the agents' token), each 16+ characters (--lab allows placeholders), and FLEXGATE_AGENTS,
  the agents' base URLs separated by commas (http://node-01:9100,...): without it the gateway
  caps nothing. FLEXGATE_READ_TOKEN guards reads (or FLEXGATE_READ_PUBLIC=true: open on
  purpose). Unknown FLEXGATE_* variables are refused. Every setting: docs/configuration.md."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flexgate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"flexgate {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_Parser)
    _add_pfi(sub)
    _add_trace(sub)
    _add_allocate(sub)
    _add_quote(sub)
    _add_simulate(sub)
    _add_sync(sub)
    _add_agent(sub)
    _add_agent_token(sub)
    _add_gateway(sub)
    _add_lab(sub)
    _add_mock_vtn(sub)
    _add_characterise(sub)
    _add_report(sub)
    _add_replay(sub)
    doctor.add_parser(sub)
    return parser


def _add_pfi(sub: Any) -> None:
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
        type=_noise,
        default=DEFAULT_NOISE,
        metavar="F",
        help="one point's measurement noise, a fraction of its throughput and power (default "
        f"{DEFAULT_NOISE:g}); the sweep's own scatter raises it, up to {MAX_NOISE:g}",
    )
    pfi.add_argument("--json", action="store_true", help="print one JSON document")
    pfi.set_defaults(command=commands.run_pfi, name="pfi")


def _add_trace(sub: Any) -> None:
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
        type=_positive,
        metavar="S",
        help="shortest period sought [s] (default: 4 sample intervals)",
    )
    trace.add_argument(
        "--max-period-s",
        type=_positive,
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
    trace.set_defaults(command=commands.run_trace, name="trace")


def _add_allocate(sub: Any) -> None:
    alloc = sub.add_parser("allocate", help="per-job caps for a facility-level reduction")
    alloc.add_argument("jobs", type=Path, metavar="JOBS", help="job-mix JSON file")
    amount = alloc.add_mutually_exclusive_group(required=True)
    amount.add_argument("--reduction-kw", type=_finite, metavar="R", help="at the meter [kW]")
    amount.add_argument(
        "--reduction-fraction",
        type=_share,
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
    alloc.set_defaults(command=commands.run_allocate, name="allocate")


def _add_quote(sub: Any) -> None:
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
        type=_fraction,
        default=DEFAULT_CONFIDENCE,
        metavar="C",
        help="probability that firm kW can be delivered (default 0.9)",
    )
    quote.add_argument("--json", action="store_true", help="print one JSON document")
    quote.set_defaults(command=commands.run_quote, name="quote")


def _add_simulate(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="the PFI study's scheduling experiment, all strategies")
    sim.add_argument(
        "--workloads",
        type=_positive_int,
        default=500,
        metavar="W",
        help="workloads (random job mixes) to average over (default 500, the study's)",
    )
    sim.add_argument(
        "--jobs",
        type=_positive_int,
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
        type=_fractions,
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
        "--seed", type=_seed, default=1, metavar="N", help="random seed, 0 or more (default 1)"
    )
    sim.add_argument("--plot", type=Path, metavar="FILE", help="write a PNG of the results")
    sim.add_argument("--json", action="store_true", help="print one JSON document")
    sim.set_defaults(command=commands.run_simulate, name="simulate")


def _add_agent(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run a GPU node agent (needs FLEXGATE_AGENT_TOKEN)",
        description="Run the agent of one GPU node: it applies the gateway's caps with a lease\n"
        "and restores every GPU's original limit when the lease ends or it stops\n"
        "(docs/agents.md).",
        epilog=AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    agent.add_argument(
        "--backend",
        choices=("sim", "nvml"),
        help="NVML (the node's GPUs) or simulated GPUs; required outside --lab (there: sim)",
    )
    agent.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    agent.add_argument(
        "--port", type=int, help="TCP port (default 9100); each agent on a host needs its own"
    )
    agent.add_argument(
        "--node-id", help="this node's name in the job mix's placement (default: the hostname)"
    )
    agent.add_argument(
        "--state-dir",
        type=Path,
        help="folder where original limits are saved (default .flexgate/agent; keep it on disk)",
    )
    agent.add_argument(
        "--gpus",
        type=_positive_int,
        help="simulated GPUs on this node (default 8); must cover the mix's placement",
    )
    agent.add_argument(
        "--job-mix", type=Path, metavar="FILE", help="job-mix JSON placing jobs on this node"
    )
    agent.add_argument(
        "--lab", action="store_true", help="lab mode: without a token, a fixed lab token is used"
    )
    agent.add_argument(
        "--restore",
        action="store_true",
        help="restore every GPU the state directory lists to its original limit, then exit "
        "(a unit's ExecStopPost; refused while an agent answers on --port)",
    )
    agent.set_defaults(command=commands.run_agent, name="agent")


def _add_agent_token(sub: Any) -> None:
    agent_token = sub.add_parser(
        "agent-token",
        help="a node's own agent token, derived from FLEXGATE_NODE_TOKEN_SECRET",
        description="Prints the token the agent of NODE_ID must be given as its "
        "FLEXGATE_AGENT_TOKEN when the gateway derives one per node from "
        "FLEXGATE_NODE_TOKEN_SECRET (read from the environment; docs/configuration.md).",
    )
    agent_token.add_argument("node_id", metavar="NODE_ID", help="the agent's --node-id")
    agent_token.add_argument("--json", action="store_true", help="print one JSON document")
    agent_token.set_defaults(command=commands.run_agent_token, name="agent-token")


def _add_gateway(sub: Any) -> None:
    gateway = sub.add_parser(
        "gateway",
        help="run the gateway service (needs tokens and FLEXGATE_AGENTS)",
        description="Run the site's gateway: the OpenADR VEN, the API and the planner that\n"
        "sends caps to the agents (docs/gateway.md).",
        epilog=GATEWAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gateway.add_argument("--host", help="address to bind (default 127.0.0.1)")
    gateway.add_argument("--port", type=int, help="TCP port (default 8000)")
    gateway.add_argument("--lab", action="store_true", help="lab mode: placeholder tokens allowed")
    gateway.set_defaults(command=commands.run_gateway, name="gateway")


def _add_lab(sub: Any) -> None:
    lab = sub.add_parser("lab", help="the whole chain on loopback: mock VTN, gateway, agents")
    lab.add_argument(
        "--nodes",
        type=_positive_int,
        default=4,
        metavar="N",
        help="simulated GPU nodes (default 4)",
    )
    lab.add_argument(
        "--gpus-per-node",
        type=_positive_int,
        default=8,
        metavar="G",
        help="GPUs per node, one job per node (default 8)",
    )
    lab.add_argument(
        "--reduction",
        type=_fraction,
        default=0.25,
        metavar="F",
        help="share of the GPU-attributable facility power the VTN asks for (default 0.25)",
    )
    lab.add_argument(
        "--duration",
        type=_positive,
        default=None,
        metavar="S",
        help="how long the event holds the reduction [s] (default 40); with --scenario lock, "
        "how long the unsafe loop runs (default 120; the default loop runs half of it, "
        "scattering one and a half times it)",
    )
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
        type=_non_negative,
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
    lab.set_defaults(command=commands.run_lab, name="lab")


def _add_mock_vtn(sub: Any) -> None:
    vtn = sub.add_parser(
        "mock-vtn", help="an OpenADR 2.0b VTN (openleadr) issuing a scenario, or a 3.1 VTN"
    )
    vtn.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="events to issue, JSON like examples/scenario.json (default: one event asking "
        "for 25 kW less, 10 s after the VEN registers, for 60 s)",
    )
    vtn.add_argument(
        "--openadr",
        choices=("2.0b", "3.1"),
        default="2.0b",
        help="3.1: the OpenADR 3.1 mock VTN (OAuth2, programs, events, webhooks, reports), "
        "issuing one event asking for 25 kW less, 10 s after a VEN registers, for 60 s",
    )
    vtn.add_argument(
        "--mqtt-broker",
        metavar="URI",
        help="3.1 only: offer the MQTT notifier (GET /notifiers) on this broker, e.g. "
        "mqtt://127.0.0.1:1883, and publish every program and event change to it",
    )
    vtn.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    vtn.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    vtn.set_defaults(command=commands.run_mock_vtn, name="mock-vtn")


def _characterise(args: argparse.Namespace) -> int:
    from flexgate.cli.characterise import (
        run_characterise,
    )  # httpx: a gateway client's, not a node's

    return run_characterise(args)


def _add_characterise(sub: Any) -> None:
    verb = sub.add_parser(
        "characterise", help="ask a running gateway to probe jobs' caps and measure their curves"
    )
    verb.add_argument(
        "jobs", nargs="*", metavar="JOB", help="the jobs to probe (none: every unmeasured job)"
    )
    verb.add_argument(
        "--gateway",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="the gateway's base URL (default http://127.0.0.1:8000)",
    )
    verb.add_argument("--token", default=None, help="the API token (default: FLEXGATE_API_TOKEN)")
    verb.add_argument("--wait", action="store_true", help="wait for the probe's end")
    verb.add_argument(
        "--timeout-s", type=_positive, default=10.0, metavar="S", help="per request (default 10)"
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=_characterise, name="characterise")


def _report(args: argparse.Namespace) -> int:
    from flexgate.cli.report import run_report  # httpx: a gateway client's

    return run_report(args)


def _month(text: str) -> str:
    try:
        datetime.strptime(text, "%Y-%m")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a month as YYYY-MM, got {text!r}") from None
    return text


def _add_report(sub: Any) -> None:
    verb = sub.add_parser(
        "report",
        help="a month's or an event's settlement from a running gateway, as CSV and HTML",
        description="Reads each event's settlement under the program's baselines from a "
        "running gateway (GET /v1/events/ID/settlement) and writes a CSV of its intervals and "
        "a self-contained HTML page with plots (docs/operations.md, 'Settlement').",
    )
    which = verb.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--month", type=_month, metavar="YYYY-MM", help="every event on the site's days of it"
    )
    which.add_argument("--event", metavar="ID", help="one event")
    verb.add_argument(
        "--gateway",
        default="http://127.0.0.1:8000",
        metavar="URL",
        help="the gateway's base URL (default http://127.0.0.1:8000)",
    )
    verb.add_argument(
        "--token",
        default=None,
        help="the read token (default: FLEXGATE_READ_TOKEN, else FLEXGATE_API_TOKEN, else none)",
    )
    verb.add_argument(
        "--rules", metavar="PRESETS", help="baseline presets, comma-separated (default: the site's)"
    )
    verb.add_argument(
        "--interval-min",
        type=int,
        choices=(1, 5, 15, 30, 60),
        metavar="MIN",
        help="settlement interval: 1, 5, 15, 30 or 60 (default: the site's)",
    )
    verb.add_argument(
        "--out", type=Path, default=Path("out"), metavar="DIR", help="folder (default out)"
    )
    verb.add_argument(
        "--timeout-s", type=_positive, default=30.0, metavar="S", help="per request (default 30)"
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=_report, name="report")


def _replay(args: argparse.Namespace) -> int:
    from flexgate.cli.replay import run_replay  # the simulated site's modules load when asked

    return run_replay(args)


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a day as YYYY-MM-DD, got {text!r}") from None


def _add_replay(sub: Any) -> None:
    verb = sub.add_parser(
        "replay",
        help="a lab replay of days of a site with events, settled as the month's report",
        description="Synthesises the site's meter history into a gateway store (a daily "
        "cycle, noise, weekends and a holiday lower), runs each event through the gateway's "
        "loop on a simulated site, settles every event under the program's baselines and "
        "writes the report's CSV and HTML (docs/operations.md, 'Settlement').",
    )
    verb.add_argument(
        "--days", type=_positive_int, default=30, metavar="N", help="days replayed (default 30)"
    )
    verb.add_argument(
        "--events",
        type=_positive_int,
        default=10,
        metavar="N",
        help="events, on distinct weekdays (default 10)",
    )
    verb.add_argument(
        "--start",
        type=_day,
        default=date(2026, 6, 1),
        metavar="YYYY-MM-DD",
        help="the first day replayed (default 2026-06-01)",
    )
    verb.add_argument(
        "--history-days",
        type=_positive_int,
        default=21,
        metavar="N",
        help="quiet days of history before it, for the baselines (default 21)",
    )
    verb.add_argument(
        "--resolution-s",
        type=int,
        choices=(60, 300),
        default=60,
        metavar="S",
        help="the synthesised history's sample period: 60 or 300 (default 60)",
    )
    verb.add_argument(
        "--nodes",
        type=_positive_int,
        default=2,
        metavar="N",
        help="simulated nodes of 8 GPUs (default 2)",
    )
    verb.add_argument(
        "--timezone",
        default="America/New_York",
        metavar="ZONE",
        help="the site's time zone (default America/New_York)",
    )
    verb.add_argument(
        "--rules",
        default="10of10,sameday-3+2",
        metavar="PRESETS",
        help="baseline presets, comma-separated (default 10of10,sameday-3+2)",
    )
    verb.add_argument(
        "--interval-min",
        type=int,
        choices=(1, 5, 15, 30, 60),
        default=15,
        metavar="MIN",
        help="settlement interval: 1, 5, 15, 30 or 60 (default 15)",
    )
    verb.add_argument("--seed", type=_seed, default=1, metavar="N", help="default 1")
    verb.add_argument(
        "--out", type=Path, default=Path("out"), metavar="DIR", help="folder (default out)"
    )
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=_replay, name="replay")


def _add_controller(verb: Any) -> None:
    """The loop's controller: sample-and-hold, proportional and integral gains."""
    verb.add_argument(
        "--hold-s",
        type=_non_negative,
        default=0.0,
        metavar="TS",
        help="the loop acts every TS seconds, holding its output between (default 0)",
    )
    verb.add_argument(
        "--proportional-gain",
        type=_non_negative,
        default=1.0,
        metavar="KP",
        help="proportional part of the controller, relative to --gain-per-s (default 1)",
    )
    verb.add_argument(
        "--integral-gain-per-s",
        type=_non_negative,
        default=0.0,
        metavar="KI",
        help="integral part [1/s] (default 0: a proportional throttle; 0 with KP 0 is no loop)",
    )


def _add_sync(sub: Any) -> None:
    sync = sub.add_parser("sync", help="phase-locking: analysis and simulation")
    verbs = sync.add_subparsers(required=True, metavar="VERB", parser_class=_Parser)
    check = verbs.add_parser("check", help="coupling per harmonic, critical coupling, verdict")
    check.add_argument("--period-s", type=_positive, metavar="T", help="iteration period [s]")
    check.add_argument("--duty", type=_fraction, metavar="D", help="compute share, in (0, 1)")
    check.add_argument(
        "--delay-s",
        type=_non_negative,
        required=True,
        metavar="TAU",
        help="the loop's delay from measuring power to acting on it [s]",
    )
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
    _add_controller(check)
    check.add_argument("--job-mix", type=Path, metavar="FILE", help="analyse every job of a mix")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    check.set_defaults(command=commands.run_sync_check, name="sync check")

    run = verbs.add_parser("simulate", help="integrate the delayed-throttle model")
    run.add_argument(
        "--jobs", type=_positive_int, required=True, metavar="N", help="jobs sharing the loop"
    )
    run.add_argument(
        "--period-s", type=_positive, required=True, metavar="T", help="iteration period [s]"
    )
    run.add_argument(
        "--duty", type=_fraction, required=True, metavar="D", help="compute share, in (0, 1)"
    )
    run.add_argument(
        "--delay-s",
        type=_non_negative,
        required=True,
        metavar="TAU",
        help="the loop's delay from measuring power to acting on it [s]",
    )
    run.add_argument(
        "--window-s",
        type=_non_negative,
        default=0.0,
        metavar="W",
        help="the loop's moving-average window [s] (default 0)",
    )
    run.add_argument(
        "--spread",
        type=_non_negative,
        default=0.0,
        metavar="F",
        help="half-width of the jobs' rate spread, as a fraction of the rate (default 0)",
    )
    run.add_argument(
        "--gain-per-s",
        type=_non_negative,
        default=DEFAULT_GAIN_PER_S,
        metavar="K",
        help=f"coupling at the fundamental [rad/s] (default {DEFAULT_GAIN_PER_S})",
    )
    _add_controller(run)
    run.add_argument(
        "--duration-s",
        type=_positive,
        default=600.0,
        metavar="S",
        help="simulated time [s] (default 600)",
    )
    run.add_argument(
        "--noise",
        type=_non_negative,
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
        "--seed", type=_seed, default=1, metavar="N", help="random seed, 0 or more (default 1)"
    )
    run.add_argument("--plot", type=Path, metavar="FILE", help="aggregate power and r1 over time")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(command=commands.run_sync_simulate, name="sync simulate")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flexgate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


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
    outside = [v for v in values if not 0.0 <= v < 1.0]
    if not values or outside:
        hint = _percent_hint(outside[0]) if outside else ""
        raise argparse.ArgumentTypeError(
            f"expected fractions in [0, 1) separated by commas, got {text!r}{hint}"
        )
    return values


def _noise(text: str) -> float:
    value = _finite(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to below 1, got {text!r}{_percent_hint(value)}"
        )
    return value


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


def _meter_fault(text: str) -> Any:
    from flexgate.labmeter import parse_fault  # the lab's modules load only when asked

    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--fault {text!r}: ")) from None


def _fraction(text: str) -> float:
    value = _finite(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a number strictly between 0 and 1, got {text!r}{_percent_hint(value)}"
        )
    return value


def _share(text: str) -> float:
    value = _finite(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to 1, got {text!r}{_percent_hint(value)}"
        )
    return value


def _percent_hint(value: float) -> str:
    """A share typed as a percentage (25 for 0.25) is the usual slip: name the fix."""
    return f" (a percentage? {value:g}% is {value / 100:g})" if 1.0 < value <= 100.0 else ""


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
