"""`flexgate doctor`: the node's and the gateway's checks before an event, one line each
(docs/cli.md, "doctor"). Exit 0 when no check failed, 1 when one did.

Without --node, --gateway or --meter the doctor checks what the environment says runs here:
the node when FLEXGATE_AGENT_BACKEND is set, the gateway when FLEXGATE_AGENTS,
FLEXGATE_API_TOKEN or FLEXGATE_DATABASE_URL is, both when both are; the node when neither (a
node being prepared has no settings yet, and NVML answers whether it is a GPU node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flexgate.cli.environment import refuse_unknown_environment
from flexgate.cli.readers import BadInputError
from flexgate.doctor import Check, fail, failed

#: Variables whose presence says a gateway runs here (its required ones, and its store).
GATEWAY_MARKS = ("FLEXGATE_AGENTS", "FLEXGATE_API_TOKEN", "FLEXGATE_DATABASE_URL")
#: The variable an agent on this machine must state.
NODE_MARK = "FLEXGATE_AGENT_BACKEND"
SHOWN = {"ok": "ok", "warn": "warn", "fail": "FAIL"}

EPILOG = """\
node checks (FLEXGATE_AGENT_* settings): NVML loads, each GPU's limits, persistence mode and
  power sensor, permission to set limits (root or CAP_SYS_ADMIN; never by setting one), the
  clock against --gateway-url, the state folder, the agent's port.
gateway checks (the gateway's settings): the settings, the store and its schema, each agent
  (answers, takes the token, may set limits), the meter, the VTN and its credentials, NATS
  and the job source when configured.
nothing is changed: no limit is set, no store is written. Exit 0 when no check failed, else 1."""


def add_parser(sub: Any) -> None:
    verb = sub.add_parser(
        "doctor",
        help="read-only checks of a GPU node or a gateway before an event",
        description="Check this node or this gateway before an event: one line per check, "
        "ok, warn or FAIL (docs/cli.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verb.add_argument("--node", action="store_true", help="the GPU node's checks (the agent's)")
    verb.add_argument("--gateway", action="store_true", help="the gateway's checks")
    verb.add_argument("--meter", action="store_true", help="one reading of the gateway's meter")
    verb.add_argument("--json", action="store_true", help="print a JSON list of the checks")
    verb.add_argument(
        "--state-dir", type=Path, help="the agent's state folder (default: its setting)"
    )
    verb.add_argument("--port", type=int, help="the agent's port (default: its setting)")
    verb.add_argument(
        "--gateway-url",
        metavar="URL",
        help="the gateway's base URL: this node's clock is compared with its",
    )
    verb.set_defaults(command=run_doctor, name="doctor")


def run_doctor(args: argparse.Namespace) -> int:
    node, gateway = chosen(args, os.environ)
    checks = environment_checks()
    if node:
        checks += node_part(args)
    if gateway:
        checks += gateway_part()
    elif args.meter:
        checks += meter_part()
    if args.json:
        print(json.dumps([c.doc() for c in checks], indent=2, default=str))
    else:
        width = max(len(c.check) for c in checks)
        for c in checks:
            print(f"{SHOWN[c.status]:<4}  {c.check:<{width}}  {c.detail}")
    return 1 if failed(checks) else 0


def chosen(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[bool, bool]:
    """(node checks, gateway checks) as the flags say, else as the environment says."""
    if args.node or args.gateway or args.meter:
        return args.node, args.gateway
    node = bool(environ.get(NODE_MARK))
    gateway = any(environ.get(name) for name in GATEWAY_MARKS)
    return node or not gateway, gateway


def environment_checks() -> list[Check]:
    """Misspelt FLEXGATE_* names, which each program alone would miss or refuse."""
    try:
        refuse_unknown_environment()
    except BadInputError as exc:
        return [fail("environment", str(exc))]
    return []


def node_part(args: argparse.Namespace) -> list[Check]:
    from flexgate.doctor.node import agent_settings, node_checks

    overrides = {"agent_state_dir": args.state_dir, "agent_port": args.port}
    settings, check = agent_settings({k: v for k, v in overrides.items() if v is not None})
    return [check, *node_checks(settings, gateway_url=args.gateway_url)]


def gateway_part() -> list[Check]:
    try:
        from flexgate.doctor.gateway import gateway_checks, gateway_settings
    except ImportError as exc:  # the agent-only install
        return [fail("gateway", f"the gateway is not installed here ({exc.name})")]
    settings, check = gateway_settings({})
    if settings is None:
        return [check]
    return [check, *asyncio.run(gateway_checks(settings))]


def meter_part() -> list[Check]:
    try:
        from flexgate.doctor.gateway import gateway_settings
        from flexgate.doctor.remote import meter_check
    except ImportError as exc:
        return [fail("meter", f"the gateway is not installed here ({exc.name})")]
    settings, check = gateway_settings({})
    if settings is None:
        return [check]
    return [asyncio.run(meter_check(settings))]
