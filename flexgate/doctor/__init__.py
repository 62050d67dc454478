"""`flexgate doctor`: read-only checks of a GPU node and of a gateway before an event
(docs/cli.md, "doctor").

    node       NVML, the GPUs, the permission to set limits, the clock, the state folder, the port
    gateway    the settings, the store, each agent, the meter, the VTN, NATS, the job source
    remote     the gateway's reads of the outside world: a meter, a VTN

Each check is one `Check`: its name, `ok`/`warn`/`fail`, a short finding and any figures. No
check changes anything: no limit is set (whether limits may be set is judged from the process's
user and capabilities), no store is written (its schema version is read), and an agent's token
is tried on a request the agent refuses as invalid whatever it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    check: str  #: what was checked, e.g. `nvml`, `gpu 0`, `agent node-01`
    status: Status
    detail: str  #: the finding, one line
    figures: dict[str, Any] = field(default_factory=dict)  #: the values behind it, for --json

    def doc(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "detail": self.detail} | self.figures


def ok(check: str, detail: str, **figures: Any) -> Check:
    return Check(check, "ok", detail, figures)


def warn(check: str, detail: str, **figures: Any) -> Check:
    return Check(check, "warn", detail, figures)


def fail(check: str, detail: str, **figures: Any) -> Check:
    return Check(check, "fail", detail, figures)


def failed(checks: Sequence[Check]) -> bool:
    return any(c.status == "fail" for c in checks)
