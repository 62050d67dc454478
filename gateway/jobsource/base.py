"""The job-source interface: what a scheduler tells the gateway about its running jobs.

A `JobSource` answers `read()` with a `SourceReading`: the jobs running now, each with its GPUs
placed as nodes and GPU indices, and the jobs it saw but could not read (`problems`, each
naming the job and why). A source that cannot answer at all (a controller that times out or
answers garbage) raises `JobSourceError`; the gateway then keeps its last good view.
`watch(changed)` calls `changed()` whenever the source hears of a change before the next poll
(the Kubernetes watch); a source without one (Slurm: its prolog and epilog call the gateway)
returns at once.

Tier and PFI tags (`parse_tags`): `flexgate:tier=2,pfi=1.8`, the convention every source reads
from the place its users can write (a Slurm job's comment; Kubernetes annotations hold one value
each, read by `parse_tier` and `parse_pfi`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from flexmodel.jobs import Placement


@dataclass(frozen=True)
class SourceJob:
    id: str
    gpus: int
    placement: tuple[Placement, ...]
    start: datetime | None = None
    end: datetime | None = None  #: the expected end (its time limit), None when unlimited
    tier: int | None = None  #: None: the site's default tier
    pfi: float | None = None  #: declared by the job's owner, None when not
    user: str | None = None
    account: str | None = None

    def audit(self) -> dict[str, object]:
        """What the audit log keeps of the job."""
        return {"id": self.id, "gpus": self.gpus, "user": self.user, "account": self.account}


@dataclass(frozen=True)
class JobProblem:
    id: str
    reason: str

    def __str__(self) -> str:
        return f"job '{self.id}': {self.reason}"


@dataclass(frozen=True)
class SourceReading:
    jobs: tuple[SourceJob, ...]
    problems: tuple[JobProblem, ...] = field(default=())


class JobSource(Protocol):
    kind: str  #: `slurm`, `kubernetes`

    async def read(self) -> SourceReading:
        """The running jobs now; raises `JobSourceError` when the source gives no answer."""
        ...

    async def watch(self, changed: Callable[[], None]) -> None:
        """Call `changed()` on every change heard of, until closed; return at once when the
        source has no watch."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class JobChanges:
    started: tuple[str, ...]
    ended: tuple[str, ...]
    changed: tuple[str, ...]  #: still running, but placed, tagged or limited anew

    def __bool__(self) -> bool:
        return bool(self.started or self.ended or self.changed)


def changes(before: Mapping[str, object], after: Mapping[str, object]) -> JobChanges:
    """What changed between two looks at the jobs (by id: a job, or its job-mix entry)."""
    return JobChanges(
        started=tuple(sorted(set(after) - set(before))),
        ended=tuple(sorted(set(before) - set(after))),
        changed=tuple(sorted(i for i in set(after) & set(before) if after[i] != before[i])),
    )


class TagError(ValueError):
    """A `flexgate:` tag that cannot be read."""


TAG = re.compile(r"flexgate:(\S*)")


def parse_tags(text: str | None) -> tuple[int | None, float | None]:
    """The tier and PFI of a `flexgate:tier=T,pfi=P` tag anywhere in `text` (either part may
    be left out); (None, None) without a tag. Raises `TagError` naming what is wrong."""
    tier: int | None = None
    pfi: float | None = None
    for tag in TAG.findall(text or ""):
        for part in tag.rstrip(";").split(","):
            key, sep, value = part.partition("=")
            if key == "tier" and sep:
                tier = parse_tier(value)
            elif key == "pfi" and sep:
                pfi = parse_pfi(value)
            else:
                raise TagError(
                    f"the tag 'flexgate:{tag}' has {part!r}: expected tier=N and/or pfi=X, "
                    "comma-separated"
                )
    return tier, pfi


def parse_tier(value: str) -> int:
    if not value.isdigit():
        raise TagError(f"the tier {value!r} is not a whole number")
    return int(value)


def parse_pfi(value: str) -> float:
    try:
        pfi = float(value)
    except ValueError:
        raise TagError(f"the PFI {value!r} is not a number") from None
    if not math.isfinite(pfi):
        raise TagError(f"the PFI {value!r} is not a finite number")
    return pfi
