"""The job feed: the job book follows a scheduler (a `JobSource`) on its own.

- **Polls** the source every `job_source_poll_s`, and at once when nudged (`POST
  /v1/jobs/refresh`, called by the Slurm prolog and epilog; the source's own watch, as
  Kubernetes has).
- **Jobs become the mix**: each running job as a job-mix entry (its placement, tier, declared
  PFI, the time left to its limit; power and throughput from the site's defaults), written to
  the book only when the view changed. The book's listeners re-plan an active event, as for
  `PUT /v1/jobs`; a job that ended is gone from the next plan, and its GPUs' caps with it.
  The time left is written anew, without a re-plan, once it is off by more than `RETIME_S`.
- **Bad input never costs the last good view.** A job the source cannot read, placed on a node
  no agent reports, or that the model refuses is reported (`problems`) and left out, or kept as
  it was last read when it was known. A source that fails (times out, answers garbage) changes
  nothing: the gateway plans on the last good view, marked `stale` after `job_source_stale_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any

from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job
from gateway.clock import Clock
from gateway.errors import GatewayError
from gateway.jobsource import JobChanges, JobProblem, JobSource, SourceJob, SourceReading, changes
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.settingsgroups.jobsource import JobSourceSettings
from gateway.store.models import iso

log = logging.getLogger("flexgate.gateway")
#: A source times out its own calls (naming them); the feed's guard, this much later, catches
#: a source that does not.
GUARD_GRACE_S = 1.0
#: A job's time left in the mix is written anew once it is off by more than this [s] (it
#: shrinks on its own, and a time limit can be extended).
RETIME_S = 60.0


def without_time_left(doc: dict[str, Any]) -> dict[str, Any]:
    """A job's entry as compared between looks: the time left shrinks on its own."""
    return {k: v for k, v in doc.items() if k != "remaining_s"}


class JobFeed:
    def __init__(
        self,
        settings: JobSourceSettings,
        clock: Clock,
        book: JobBook,
        fleet: Fleet,
        source: JobSource,
    ) -> None:
        self.settings, self.clock, self.book, self.fleet = settings, clock, book, fleet
        self.source = source
        self.jobs: dict[str, SourceJob] = {}  #: the last good view, by job id
        self.problems: list[str] = []  #: the jobs of the last answer left out, and why
        self.fault: str | None = None  #: why the last look failed; None when it worked
        self.reads = 0  #: looks that worked
        self.failures = 0  #: looks that failed
        self.last_read_at: datetime | None = None
        self.last_changes: JobChanges | None = None  #: the last look that changed the mix
        self.last_changed_at: datetime | None = None
        self._since_s = clock.monotonic()  #: the last good look (or the start) [monotonic s]
        self._nudged = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def kind(self) -> str:
        return self.source.kind

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(self._watch())]

    async def stop(self) -> None:
        await self.source.close()  # a watch returns once its source is closed
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def nudge(self) -> None:
        """Look again now (a job started or ended), without waiting for the poll."""
        self._nudged.set()

    @property
    def age_s(self) -> float:
        """How old the view is: since the last good look, or the start [s]."""
        return self.clock.monotonic() - self._since_s

    @property
    def stale(self) -> bool:
        return self.age_s > self.settings.job_source_stale_s

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "fault": self.fault,
            "stale": self.stale,
            "age_s": round(self.age_s, 3),
            "last_read_at": iso(self.last_read_at),
            "problems": self.problems,
            "reads": self.reads,
            "failures": self.failures,
            "last_changes": None
            if self.last_changes is None
            else {
                "started": list(self.last_changes.started),
                "ended": list(self.last_changes.ended),
                "changed": list(self.last_changes.changed),
                "at": iso(self.last_changed_at),
            },
        }

    def job_info(self) -> list[dict[str, Any]]:
        """Per job of the view, what the mix does not hold: its start, end, user, account."""
        return [
            {
                "id": job.id,
                "start": iso(job.start),
                "end": iso(job.end),
                "user": job.user,
                "account": job.account,
            }
            for job in self.jobs.values()
        ]

    async def _follow(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # the store down, say: the next look tries again
                log.exception("job source %s: the look failed", self.kind)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudged.wait(), self.settings.job_source_poll_s)
            self._nudged.clear()

    async def _watch(self) -> None:
        try:
            await self.source.watch(self.nudge)
        except Exception:  # polling goes on without the watch
            log.exception("job source %s: the watch stopped; polling goes on", self.kind)

    async def poll(self) -> bool:
        """One look; True when it worked (whether or not anything changed)."""
        async with self._lock:
            try:
                guard_s = self.settings.job_source_timeout_s + GUARD_GRACE_S
                reading = await asyncio.wait_for(self.source.read(), guard_s)
            except TimeoutError:
                self._failed(f"no answer within {guard_s:g} s")
                return False
            except GatewayError as exc:
                self._failed(str(exc))
                return False
            except Exception as exc:  # a source's bug must not stop the gateway following
                log.exception("job source %s: unexpected error", self.kind)
                self._failed(f"unexpected error: {exc!r}")
                return False
            return await self._apply(reading)

    async def _apply(self, reading: SourceReading) -> bool:
        """Sort the answer into the jobs kept and the problems, and write what changed."""
        now = self.clock.now()
        problems = list(reading.problems)
        accepted: dict[str, SourceJob] = {}
        docs: dict[str, dict[str, Any]] = {}
        known_nodes = set(self.fleet.nodes)
        for job in reading.jobs:
            unknown = sorted({p.node for p in job.placement} - known_nodes)
            if unknown:
                problems.append(
                    JobProblem(
                        job.id,
                        f"placed on node(s) {', '.join(unknown)} that no agent "
                        "reports (FLEXGATE_AGENTS)",
                    )
                )
                continue
            doc = self._doc(job, now)
            try:
                parse_job(doc, tiers=self.book.tiers)
            except FlexModelError as exc:
                problems.append(JobProblem(job.id, str(exc)))
                continue
            accepted[job.id], docs[job.id] = job, doc
        current = {d["id"]: d for d in self.book.docs()}
        for problem in problems:  # a job in the mix (before a restart, too) keeps its entry
            if problem.id in current and problem.id not in docs:
                docs[problem.id] = current[problem.id]
                if problem.id in self.jobs:
                    accepted[problem.id] = self.jobs[problem.id]
        self._report(problems)
        found = changes(
            {i: without_time_left(d) for i, d in current.items()},
            {i: without_time_left(d) for i, d in docs.items()},
        )
        if found:
            entries = self._entries(found, accepted)
            try:
                await self.book.follow(list(docs.values()), f"jobsource:{self.kind}", entries)
            except GatewayError as exc:  # the whole view refused (two jobs on one GPU ...)
                self._failed(f"its view of the jobs is refused: {exc}")
                return False
            log.info(
                "job source %s: %s", self.kind, ", ".join(f"{a} {d['id']}" for a, d in entries)
            )
            self.last_changes, self.last_changed_at = found, now
        elif self._time_left_drifted(current, docs):
            self.book.retime(list(docs.values()))
        self.jobs = accepted
        self.fault, self.reads, self.last_read_at = None, self.reads + 1, now
        self._since_s = self.clock.monotonic()
        return True

    @staticmethod
    def _time_left_drifted(
        current: dict[str, dict[str, Any]], docs: dict[str, dict[str, Any]]
    ) -> bool:
        for job_id, doc in docs.items():
            was, now = current[job_id].get("remaining_s"), doc.get("remaining_s")
            if (was is None) != (now is None) or (
                was is not None and now is not None and abs(was - now) > RETIME_S
            ):
                return True
        return False

    def _entries(
        self, found: JobChanges, accepted: dict[str, SourceJob]
    ) -> list[tuple[str, dict[str, Any]]]:
        """The audit entries of what changed between the book and the new view."""
        ended = [self.jobs[i].audit() if i in self.jobs else {"id": i} for i in found.ended]
        return [
            *(("jobsource.start", accepted[i].audit()) for i in found.started),
            *(("jobsource.end", detail) for detail in ended),
            *(("jobsource.change", accepted[i].audit()) for i in found.changed),
        ]

    def _doc(self, job: SourceJob, now: datetime) -> dict[str, Any]:
        settings = self.settings
        doc: dict[str, Any] = {
            "id": job.id,
            "gpus": job.gpus,
            "power_w": settings.job_source_gpu_power_w,
            "throughput": job.gpus * settings.job_source_throughput_per_gpu,
            "tier": settings.job_source_default_tier if job.tier is None else job.tier,
            "placement": [{"node": p.node, "gpus": list(p.gpus)} for p in job.placement],
        }
        if job.pfi is not None:
            doc["pfi"] = job.pfi
        if job.end is not None:
            doc["remaining_s"] = max((job.end - now).total_seconds(), 0.0)
        return doc

    def _report(self, problems: list[JobProblem]) -> None:
        said = [str(p) for p in problems]
        for line in sorted(set(said) - set(self.problems)):  # each new problem once
            log.warning("job source %s: left out %s", self.kind, line)
        self.problems = said

    def _failed(self, reason: str) -> None:
        if reason != self.fault:
            log.warning(
                "job source %s: %s; planning on the view of %.0f s ago",
                self.kind,
                reason,
                self.age_s,
            )
        self.fault, self.failures = reason, self.failures + 1
