"""The agent's log: one line per decision an operator may need to explain later.

Each line is `what key=value ...` on the logger `flexgate.agent`, so it reads as text and
splits with a shell one-liner: the start (node, backend, GPUs, address), every cap that moves
(GPU, requested and enforced watts, plan, generation), a lease that ran out and the stop (the
GPUs restored), and every GPU that refused a change. Lease renewals, which change nothing and
come every reconcile period, are logged at DEBUG only.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("flexgate.agent")


def decision(level: int, what: str, **fields: object) -> None:
    """Log `what` with `fields` as `key=value` pairs (floats to 0.1, lists comma-separated)."""
    if log.isEnabledFor(level):
        log.log(level, "%s %s", what, " ".join(f"{k}={_text(v)}" for k, v in fields.items()))


def show_on_stderr(level: int = logging.INFO) -> None:
    """Send the agent's log to stderr (the service manager's journal), once."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)


def _text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(_text, value)) or "none"
    text = str(value)
    return repr(text) if not text or any(c.isspace() for c in text) else text
