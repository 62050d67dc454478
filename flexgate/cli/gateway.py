"""`flexgate gateway`: run the site's gateway (the OpenADR VEN, the API and the planner).

The gateway's modules load when the verb runs: a GPU node's install has none of them."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flexgate.cli.environment import first_error, refuse_unknown_environment
from flexgate.cli.readers import BadInputError

EPILOG = """\
required: FLEXGATE_API_TOKEN (callers' bearer token for every change) and FLEXGATE_AGENT_TOKEN
  (the agents' token), each 16+ characters (--lab allows placeholders), and FLEXGATE_AGENTS,
  the agents' base URLs separated by commas (http://node-01:9100,...): without it the gateway
  caps nothing. FLEXGATE_READ_TOKEN guards reads (or FLEXGATE_READ_PUBLIC=true: open on
  purpose). Unknown FLEXGATE_* variables are refused. Every setting: docs/configuration.md."""


def add_parser(sub: Any) -> None:
    gateway = sub.add_parser(
        "gateway",
        help="run the gateway service (needs tokens and FLEXGATE_AGENTS)",
        description="Run the site's gateway: the OpenADR VEN, the API and the planner that\n"
        "sends caps to the agents (docs/gateway.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gateway.add_argument("--host", help="address to bind (default 127.0.0.1)")
    gateway.add_argument("--port", type=int, help="TCP port (default 8000)")
    gateway.add_argument("--lab", action="store_true", help="lab mode: placeholder tokens allowed")
    gateway.set_defaults(command=run_gateway, name="gateway")


def run_gateway(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.run import run_gateway
    from gateway.settings import GatewaySettings

    given = {"host": args.host, "port": args.port, "lab": True if args.lab else None}
    refuse_unknown_environment()
    try:
        settings = GatewaySettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise BadInputError(first_error(exc)) from None
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
