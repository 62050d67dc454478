"""Slurm as a job source: the controller asked through `squeue --json` (Slurm 21.08 or later;
met for real on 22.05, and read in the shapes later versions write).

The command inherits the gateway's environment, so `SLURM_CONF` (and munge's socket, through
it) is honoured as by every Slurm command; `bin_dir` chooses the Slurm installation when it is
not on PATH. A job counts while it is RUNNING or CONFIGURING (its nodes are allocated; a
PrologSlurmctld runs then). Per job:

- GPUs per node from the GRES detail (`gpu:4(IDX:0-3)`, `gpu:h200:2(IDX:0,2)`), one entry per
  allocated node in allocation order. Slurm keeps GPUs out of a job's TRES unless slurmdbd
  tracks `gres/gpu`, so the GRES detail is the one place every cluster has them. A job with no
  GPU at all is not a GPU job and is left out without a word.
- The expected end from its time limit (`end_time`); none when the limit is unlimited.
- Tier and PFI from a `flexgate:tier=T,pfi=P` tag in its comment (`sbatch --comment`): any
  user can write it at submission, it needs no QOS made by an administrator nor slurmdbd, and
  every Slurm command shows it.
- User and account, for the audit log.

A job that cannot be read is a `JobProblem`; an answer that is not squeue's JSON (or a command
that fails or times out) raises `JobSourceError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flexmodel.jobs import Placement
from gateway.errors import JobSourceError
from gateway.jobsource.base import JobProblem, SourceJob, SourceReading, TagError, parse_tags

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING"})
GPU_DETAIL = re.compile(r"gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")
#: A number this large or more is Slurm's "unset" or "unlimited" (NO_VAL, INFINITE).
UNLIMITED = 0xFFFFFFFE


class SlurmSource:
    kind = "slurm"

    def __init__(self, *, timeout_s: float, bin_dir: str = "") -> None:
        self.timeout_s = timeout_s
        self.squeue = str(Path(bin_dir) / "squeue") if bin_dir else "squeue"

    async def read(self) -> SourceReading:
        return parse_squeue(await self._run(self.squeue, "--json"))

    async def watch(self, changed: Callable[[], None]) -> None:
        """Slurm has no watch: its prolog and epilog call `POST /v1/jobs/refresh` instead."""

    async def close(self) -> None:
        pass

    async def _run(self, *argv: str) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed whole on a timeout
            )
        except OSError as exc:
            raise JobSourceError(f"{argv[0]} could not run: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except TimeoutError:
            raise JobSourceError(
                f"{' '.join(argv)} gave no answer within {self.timeout_s:g} s"
            ) from None
        finally:  # timed out, or the caller gave up: no command is left behind
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if process.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()
            raise JobSourceError(
                f"{' '.join(argv)} failed (exit {process.returncode}): "
                f"{message[-1] if message else 'no message'}"
            )
        return out.decode(errors="replace")


def parse_squeue(text: str) -> SourceReading:
    """The running GPU jobs of an `squeue --json` answer."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JobSourceError(f"squeue --json answered something not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise JobSourceError("squeue --json answered JSON without a 'jobs' list")
    if doc.get("errors"):
        raise JobSourceError(f"squeue --json reported errors: {doc['errors']}")
    jobs, problems = [], []
    for entry in doc["jobs"]:
        ident = str(entry.get("job_id", "?")) if isinstance(entry, dict) else "?"
        try:
            job = parse_job(entry)
        except (TagError, KeyError, TypeError, ValueError) as exc:
            problems.append(JobProblem(ident, _reason(exc)))
            continue
        if job is not None:
            jobs.append(job)
    return SourceReading(tuple(jobs), tuple(problems))


def _reason(exc: Exception) -> str:
    if isinstance(exc, TagError):
        return f"its comment: {exc}"
    if isinstance(exc, KeyError):
        return f"squeue's entry lacks {exc}"
    return f"squeue's entry is malformed: {exc}"


def parse_job(entry: dict[str, Any]) -> SourceJob | None:
    """One running GPU job; None for a job that is not running or holds no GPU."""
    if not RUNNING_STATES.intersection(_states(entry["job_state"])):
        return None
    nodes = allocated_nodes(entry["job_resources"])
    details = entry.get("gres_detail") or []
    if not any(GPU_DETAIL.search(d) for d in details):
        return None
    if len(details) != len(nodes):
        raise ValueError(f"{len(details)} GRES entries for {len(nodes)} allocated nodes")
    placement = []
    for node, detail in zip(nodes, details, strict=True):
        indices = gpu_indices(detail)
        if indices:
            placement.append(Placement(node=node, gpus=indices))
    tier, pfi = parse_tags(entry.get("comment"))
    limit = _number(entry.get("time_limit"))
    return SourceJob(
        id=str(entry["job_id"]),
        gpus=sum(len(p.gpus) for p in placement),
        placement=tuple(placement),
        start=_time(entry.get("start_time")),
        end=_time(entry.get("end_time")) if limit is not None else None,
        tier=tier,
        pfi=pfi,
        user=entry.get("user_name") or None,
        account=entry.get("account") or None,
    )


def allocated_nodes(resources: dict[str, Any]) -> list[str]:
    """The job's nodes in allocation order: `allocated_nodes[].nodename` up to Slurm 23.11,
    `nodes.allocation[].name` from 24.05."""
    if "allocated_nodes" in resources:
        return [str(n["nodename"]) for n in resources["allocated_nodes"]]
    return [str(n["name"]) for n in resources["nodes"]["allocation"]]


def _states(value: Any) -> list[str]:
    """A job's states: one string up to Slurm 22.05, a list (with flags) from 23.02."""
    return [value] if isinstance(value, str) else list(value)


def _number(value: Any) -> int | None:
    """A number as squeue writes it: plain up to 22.05, `{"set", "infinite", "number"}` from
    23.02; None when unset or unlimited (INFINITE is stored as 0xffffffff)."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if not isinstance(value, int) or isinstance(value, bool) or value >= UNLIMITED:
        return None
    return value


def gpu_indices(detail: str) -> tuple[int, ...]:
    """The GPU indices of one node's GRES detail: `gpu:4(IDX:0-3)` gives (0, 1, 2, 3)."""
    out: list[int] = []
    for count, ranges in GPU_DETAIL.findall(detail):
        indices = expand(ranges)
        if len(indices) != int(count):
            raise ValueError(f"GRES '{detail}' lists {len(indices)} indices for {count} GPUs")
        out += indices
    if len(set(out)) != len(out):
        raise ValueError(f"GRES '{detail}' names a GPU twice")
    return tuple(sorted(out))


def expand(ranges: str) -> list[int]:
    """`0-1,4` gives [0, 1, 4]."""
    out: list[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"GPU indices '{ranges}' are not a list of numbers and ranges")
        out += range(int(low), int(high or low) + 1)
    return out


def _time(value: Any) -> datetime | None:
    epoch = _number(value)
    return None if epoch is None or epoch <= 0 else datetime.fromtimestamp(epoch, UTC)
