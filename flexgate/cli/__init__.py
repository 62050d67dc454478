"""The `flexgate` command line (docs/cli.md).

Every data command takes `--json` and then prints one JSON document on stdout. Exit codes: 0 on
success (an infeasible request is a valid answer), 2 on bad input with a one-line message on
stderr, 1 on other failures. Bad input never shows a traceback.

    parser       the verbs, assembled into one parser
    pfi, trace, allocate, quote, simulate, sync, agent, agent_token, gateway, lab, mock_vtn,
    characterise, report, replay, doctor
                 one module per verb: its options (`add_parser`) and its command
    options      the parser class and the checks on option values, which every verb shares
    environment  unknown FLEXGATE_* names refused; a refused setting in one line
    readers      job mixes, sweeps and power traces from files (`BadInputError` names the file)
    output       JSON or tables, progress bars and plots
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
