"""`flexgate agent-token`: a node's own agent token, derived from the gateway's site secret."""

from __future__ import annotations

import argparse
from typing import Any

from flexgate.cli import output
from flexgate.cli.readers import BadInputError


def add_parser(sub: Any) -> None:
    verb = sub.add_parser(
        "agent-token",
        help="a node's own agent token, derived from FLEXGATE_NODE_TOKEN_SECRET",
        description="Prints the token the agent of NODE_ID must be given as its "
        "FLEXGATE_AGENT_TOKEN when the gateway derives one per node from "
        "FLEXGATE_NODE_TOKEN_SECRET (read from the environment; docs/configuration.md).",
    )
    verb.add_argument("node_id", metavar="NODE_ID", help="the agent's --node-id")
    verb.add_argument("--json", action="store_true", help="print one JSON document")
    verb.set_defaults(command=run_agent_token, name="agent-token")


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
