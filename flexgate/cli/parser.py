"""The `flexgate` argument parser: every verb's module adds its own (docs/cli.md).

Each verb's module holds its options and its command; this one lists the verbs in the order
`flexgate --help` shows them.
"""

from __future__ import annotations

import argparse

from flexgate.cli import (
    agent,
    agent_token,
    allocate,
    characterise,
    doctor,
    gateway,
    lab,
    mock_vtn,
    pfi,
    quote,
    replay,
    report,
    simulate,
    sync,
    trace,
)
from flexgate.cli.options import Parser

DESCRIPTION = (
    "flexgate: demand response for GPU data centres. The model commands (pfi, trace, allocate, "
    "quote, simulate, sync) read files and print answers; agent, gateway and mock-vtn run "
    "services; lab runs the whole chain on this machine; doctor checks a node or a gateway. "
    "Data commands take --json. Exit codes: 0 success, 2 bad input (one line on stderr), "
    "1 other failure. Documentation: docs/cli.md."
)
VERBS = (
    pfi,
    trace,
    allocate,
    quote,
    simulate,
    sync,
    agent,
    agent_token,
    gateway,
    lab,
    mock_vtn,
    characterise,
    report,
    replay,
    doctor,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="flexgate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"flexgate {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=Parser)
    for verb in VERBS:
        verb.add_parser(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flexgate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"
