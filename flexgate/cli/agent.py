"""`flexgate agent`: run a GPU node's agent, or restore its GPUs' original limits (`--restore`).

The agent's modules load when the verb runs: the parser is built for every command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from flexgate.cli import options
from flexgate.cli.environment import first_error, refuse_unknown_environment
from flexgate.cli.readers import BadInputError, read_job_mix

EPILOG = """\
required: FLEXGATE_AGENT_TOKEN, the bearer token the gateway sends with caps (16+ characters;
  --lab allows none), and --backend (nvml on a GPU node, sim for simulated GPUs; --lab: sim).
  Options override the FLEXGATE_AGENT_* variables (docs/configuration.md).
two agents on one host need their own --port and --node-id:
  flexgate agent --lab --node-id node-01 --port 9101
  flexgate agent --lab --node-id node-02 --port 9102"""


def add_parser(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run a GPU node agent (needs FLEXGATE_AGENT_TOKEN)",
        description="Run the agent of one GPU node: it applies the gateway's caps with a lease\n"
        "and restores every GPU's original limit when the lease ends or it stops\n"
        "(docs/agents.md).",
        epilog=EPILOG,
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
        type=options.positive_int,
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
    agent.set_defaults(command=run_agent, name="agent")


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
        raise BadInputError(first_error(exc)) from None
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
