"""The `flexgate` command line (docs/cli.md).

Every data command takes `--json` and then prints one JSON document on stdout. Exit codes: 0 on
success (an infeasible request is a valid answer), 2 on bad input with a one-line message on
stderr, 1 on other failures. Bad input never shows a traceback.

    parser     the commands, their options and the checks on them
    readers    job mixes, sweeps and power traces from files (`BadInputError` names the file)
    commands   one function per command
    output     JSON or tables
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from flexgate.cli.parser import build_parser
from flexgate.cli.readers import BadInputError
from flexmodel.errors import FlexModelError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
