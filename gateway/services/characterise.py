"""Characterisation: measure a job's curve on site by stepping its caps a little, outside events.

A probe takes a batch of jobs and runs each through its uncapped level, then `probe_levels`
caps stepping down to the cap where its declared curve reaches its probe floor (the stricter of
its QoS floor and `probe_min_throughput_fraction`), never lower, with the uncapped level again
after the last cap and after every `probe_reference_every` caps (`flexmodel.drift.probe_steps`):
those references bracket the capped levels, so the fit measures the job's drift across the
probe and removes it (`JobCurves.record_probe`). Each level is held for
`probe_periods` iteration periods at that cap (as the curve stretches them) plus
`probe_settle_s`, through the ordinary dispatch path: a stored plan with a lease, renewed by
the reconciler, so a gateway that dies mid-probe leaves caps that lapse and are restored.
Each level's stepping, reading and the fit at the end: `gateway.services.proberun`.

Refused, with the reason: during an event (or while caps step back after one), a protected or
unplaced job, a job whose throughput alone is more than `probe_budget` of the site's (the jobs
probed at once hold at most that share), a second probe while one runs. An event that starts
mid-probe ends it at once: its plan replaces the probe's caps (`Targets.hold`).

Every probe is recorded in the audit log when it starts and when it ends (`probe.started`,
`probe.ended`, with its whole state), so the last probe outlives a restart: one that started
and never ended (the gateway died mid-probe) shows `interrupted` after the restart, whose
restore put every GPU back.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from flexmodel.curves import operating_point
from flexmodel.drift import probe_steps
from flexmodel.jobs import JobMix
from gateway.clock import Clock
from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.services.curves import JobCurves
from gateway.services.events import Events
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.probe import Probe, probe_floor
from gateway.services.probecaps import probe_caps
from gateway.services.proberun import ProbeRunner
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store

log = logging.getLogger("flexgate.gateway")


class Characteriser:
    def __init__(
        self,
        settings: GatewaySettings,
        store: Store,
        clock: Clock,
        book: JobBook,
        fleet: Fleet,
        targets: Targets,
        events: Events,
        curves: JobCurves,
    ) -> None:
        self.settings, self.store, self.clock = settings, store, clock
        self.book, self.fleet = book, fleet
        self.targets, self.events, self.curves = targets, events, curves
        self.runner = ProbeRunner(settings, clock, book, fleet, targets, curves)
        self.current: Probe | None = None  #: the probe running or last run
        self._task: asyncio.Task[None] | None = None
        self._schedule: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.current = self._last_recorded()
        if self.settings.probe_every_s > 0:
            self._schedule = asyncio.create_task(self._scheduled())

    def stop(self) -> None:
        if self.running and self.current is not None:
            self.current.status = "interrupted"
            self.current.reason = "the gateway stopped: the leases and its next start restore"
            self._record(self.current, "probe.ended")
        for task in (self._task, self._schedule):
            if task is not None:
                task.cancel()

    def _record(self, probe: Probe, action: str) -> None:
        with self.store.session() as s:
            repo.audit(s, actor=probe.actor, action=action, detail=probe.doc(), at=self.clock.now())
            s.commit()

    def _last_recorded(self) -> Probe | None:
        """The last probe before this start; one that never ended is marked interrupted."""
        with self.store.session() as s:
            row = repo.latest_audit(s, actions=("probe.started", "probe.ended"))
        if row is None:
            return None
        probe = Probe.of(row.detail)
        if row.action == "probe.started":
            probe.status = "interrupted"
            probe.reason = (
                "the gateway stopped mid-probe without ending it: its restart restored every GPU"
            )
            self._record(probe, "probe.ended")
        return probe

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def characterise(self, job_ids: list[str] | None, actor: str) -> Probe:
        """Start a probe of these jobs (None: every placed job without a measured curve);
        `ConflictError` or `InvalidRequestError` naming the reason, and nothing changes."""
        self._refuse_when_busy()
        mix = self.book.mix()
        chosen, skipped = self._choose(mix, job_ids)
        if not chosen:
            reasons = "; ".join(f"{s['id']}: {s['reason']}" for s in skipped) or "no jobs"
            raise InvalidRequestError(f"nothing to characterise ({reasons})")
        index = {job.id: j for j, job in enumerate(mix.jobs)}
        jobs = {
            job_id: probe_caps(
                mix,
                index[job_id],
                probe_floor(mix.jobs[index[job_id]], self.settings),
                self._levels,
            )
            for job_id in chosen
        }
        probe = Probe(
            id=f"probe-{uuid.uuid4().hex[:12]}",
            jobs=jobs,
            hold_s=self._holds(mix, index, jobs),
            skipped=skipped,
            actor=actor,
            steps=probe_steps(self._levels, self.settings.probe_reference_every),
        )
        self.current = probe
        self._record(probe, "probe.started")
        self._task = asyncio.create_task(self._run(probe))
        return probe

    @property
    def _levels(self) -> int:
        return self.settings.probe_levels

    def _refuse_when_busy(self) -> None:
        if self.running:
            assert self.current is not None
            raise ConflictError(f"probe {self.current.id} is running: one probe at a time")
        busy = self.targets.busy
        if busy is None and self.events.active():
            busy = "an event is active"
        if busy is not None:
            raise ConflictError(f"no probe now: {busy}")

    def _choose(
        self, mix: JobMix, job_ids: list[str] | None
    ) -> tuple[list[str], list[dict[str, str]]]:
        """The jobs to probe, within the budget, and those left out with why. Named jobs that
        cannot be probed are refused; of all unmeasured jobs, those that fit are taken."""
        known = {job.id: job for job in mix.jobs}
        for job_id in job_ids or []:
            if job_id not in known:
                raise NotFoundError(f"no job '{job_id}'")
        total = sum(job.throughput for job in mix.jobs)
        measured = set(self.curves.latest())
        wanted = (
            job_ids if job_ids is not None else [j.id for j in mix.jobs if j.id not in measured]
        )
        chosen, skipped, share = [], [], 0.0
        budget = self.settings.probe_budget
        for job_id in wanted:
            job = known[job_id]
            mine = job.throughput / total
            why = None
            if job.protected:
                why = "protected: its caps are never touched"
            elif not job.placement:
                why = "no placement: the gateway cannot cap it"
            elif mine > budget:
                why = (
                    f"holds {100 * mine:.3g}% of the site's throughput, above the probe budget "
                    f"FLEXGATE_PROBE_BUDGET={budget:g}"
                )
            elif share + mine > budget:
                why = "over the probe budget with the jobs probed now: probe it next"
            if why is None:
                chosen.append(job_id)
                share += mine
            elif job_ids is not None:  # a job named and refused: nothing starts
                raise InvalidRequestError(f"job '{job_id}' cannot be characterised: {why}")
            else:
                skipped.append({"id": job_id, "reason": why})
        return chosen, skipped

    def _holds(
        self, mix: JobMix, index: dict[str, int], jobs: dict[str, list[float]]
    ) -> list[float]:
        """Each level's hold: `probe_periods` of the slowest job's iterations at that level,
        its period stretched as its curve says, plus the settling time [s]."""
        measured = self.fleet.loop_measurements().periods_s
        holds = []
        for level in range(self._levels + 1):
            longest = 0.0
            for job_id, caps in jobs.items():
                j = index[job_id]
                job = mix.jobs[j]
                thr = float(operating_point(mix.curves.select(slice(j, j + 1)), caps[level])[1][0])
                period = measured.get(job_id, job.period_s) * job.throughput / max(thr, 1e-9)
                longest = max(longest, period)
            holds.append(self.settings.probe_periods * longest + self.settings.probe_settle_s)
        return holds

    async def _run(self, probe: Probe) -> None:
        try:
            await self.runner.run(probe)
        except asyncio.CancelledError:
            raise  # the gateway stops: `stop` said so
        except Exception as exc:  # restore first, then say what failed
            log.exception("probe %s failed", probe.id)
            probe.status, probe.reason = "failed", str(exc)
            await self.targets.end_probe(probe.id)
        self._record(probe, "probe.ended")

    async def _scheduled(self) -> None:
        """Every `probe_every_s`, a probe of the unmeasured jobs, when none runs and no event."""
        while True:
            await self.clock.sleep(self.settings.probe_every_s)
            try:
                await self.characterise(None, "schedule")
            except (ConflictError, InvalidRequestError) as exc:
                log.info("scheduled probe skipped: %s", exc)
            except Exception:
                log.exception("scheduled probe failed")
