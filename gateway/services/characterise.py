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
At the end of each step the agent's stretch at that step's cap (`JobTelemetry.stretches`, with
when it was measured) is recorded (`measured`).
After the uncapped level, each job's caps are kept above its communication level as measured
there (`gateway.services.probecaps`: a cap below it clips the power flat, with no period to
measure).
A job whose measured throughput falls below its floor, or whose power shows no clear period at
a level (the cap clips it flat), goes no lower. At the end every GPU gets its original limit
back and each job's recorded stretches are fitted with their drift (`gateway.services.curves`;
a job with none, from agents that do not report stretches, by its agents' points as before).

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
from dataclasses import dataclass, field
from typing import Any

from agents.protocol import GpuCap
from flexmodel.curves import operating_point
from flexmodel.drift import probe_steps
from flexmodel.jobs import JobMix
from gateway.clock import Clock
from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.services.curves import JobCurves
from gateway.services.events import Events
from gateway.services.fleet import Fleet, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.probecaps import after_reference, probe_caps, record_stretch
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store

log = logging.getLogger("flexgate.gateway")
#: A probe looks this often whether an event took over (as a share of a level's hold).
WATCH_SLICES = 20


@dataclass
class Probe:
    id: str
    jobs: dict[str, list[float]]  #: job id -> its caps, uncapped first [W]
    hold_s: list[float]  #: each level's hold [s]
    skipped: list[dict[str, str]]
    actor: str
    #: the levels in the order run (0 the uncapped reference, then caps going down)
    steps: list[int] = field(default_factory=list)
    status: str = "running"  #: running, completed, interrupted, failed
    level: int = 0
    step: int = 0
    reason: str | None = None
    stopped: dict[str, str] = field(default_factory=dict)  #: job id -> why it went no lower
    curves_changed: list[str] = field(default_factory=list)
    #: job id -> the agent's stretch at each step's cap, in the order run
    measured: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "actor": self.actor,
            "jobs": [
                {"id": j, "caps_w": caps, "measured": self.measured.get(j, [])}
                for j, caps in self.jobs.items()
            ],
            "hold_s": self.hold_s,
            "steps": self.steps,
            "level": self.level,
            "step": self.step,
            "skipped": self.skipped,
            "stopped": [{"id": j, "reason": r} for j, r in self.stopped.items()],
            "reason": self.reason,
            "curves_changed": self.curves_changed,
        }

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Probe:
        """The probe `doc()` described."""
        return cls(
            id=doc["id"],
            jobs={j["id"]: list(j["caps_w"]) for j in doc["jobs"]},
            hold_s=list(doc["hold_s"]),
            skipped=list(doc["skipped"]),
            actor=doc["actor"],
            # probes recorded before references: each level once, going down
            steps=list(doc.get("steps", range(len(doc["hold_s"])))),
            status=doc["status"],
            level=doc["level"],
            step=doc.get("step", doc["level"]),
            measured={j["id"]: list(j.get("measured", [])) for j in doc["jobs"]},
            reason=doc["reason"],
            stopped={s["id"]: s["reason"] for s in doc["stopped"]},
            curves_changed=list(doc["curves_changed"]),
        )


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
            job_id: probe_caps(mix, index[job_id], self._floor(mix, index[job_id]), self._levels)
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

    def _floor(self, mix: JobMix, j: int) -> float:
        return max(mix.jobs[j].min_throughput_fraction, self.settings.probe_min_throughput_fraction)

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
            await self._levels_of(probe)
        except asyncio.CancelledError:
            raise  # the gateway stops: `stop` said so
        except Exception as exc:  # restore first, then say what failed
            log.exception("probe %s failed", probe.id)
            probe.status, probe.reason = "failed", str(exc)
            await self.targets.end_probe(probe.id)
        self._record(probe, "probe.ended")

    async def _levels_of(self, probe: Probe) -> None:
        """Step the probe's levels, then restore and fit; stops when a target takes over."""
        for step, level in enumerate(probe.steps):
            probe.step, probe.level = step, level
            if not await self.targets.probe(
                probe.id, self._desired(probe, level), self._plan(probe, level)
            ):
                return self._interrupted(probe)
            if not await self._hold(probe, probe.hold_s[level]):
                return self._interrupted(probe)
            readings = await self._readings()
            if step == 0:
                self._keep_visible(probe, readings)
            self._stop_below_floor(probe, level, readings)
            self._record_stretches(probe, level, readings)
        await self.targets.end_probe(probe.id)
        probe.status = "completed"
        fitted, changed = await self.curves.record_probe(probe.id, probe.measured)
        # Agents that report no stretches: their points per cap, as before references.
        rest = set(probe.jobs) - fitted
        changed += await self.curves.harvest(rest, origin="probe") if rest else []
        probe.curves_changed = changed

    def _record_stretches(self, probe: Probe, level: int, readings: dict[str, Any]) -> None:
        """Each job's stretch at this step's cap (`record_stretch`)."""
        for job_id, caps in probe.jobs.items():
            reading = readings.get(job_id)
            if reading is None or (level and (job_id in probe.stopped or level >= len(caps))):
                continue
            taken = probe.measured.setdefault(job_id, [])
            record_stretch(taken, level, caps[level], reading.stretches)

    def _interrupted(self, probe: Probe) -> None:
        probe.status = "interrupted"
        took_over = self.targets.busy or "a target took over"
        probe.reason = f"{took_over}: its plan replaced the probe's caps"
        log.info("probe %s: %s", probe.id, probe.reason)

    async def _hold(self, probe: Probe, hold_s: float) -> bool:
        """Wait out a level; False as soon as a target took over from the probe."""
        for _ in range(WATCH_SLICES):
            await self.clock.sleep(hold_s / WATCH_SLICES)
            if self.targets.probe_id != probe.id:
                return False
        return True

    async def _readings(self) -> dict[str, Any]:
        return {r.job_id: r for r in job_readings(await self.fleet.telemetry())}

    def _keep_visible(self, probe: Probe, readings: dict[str, Any]) -> None:
        """After the uncapped level: each job's caps as `after_reference` keeps them."""
        for job_id, caps in probe.jobs.items():
            reading = readings.get(job_id)
            if reading is None or job_id in probe.stopped:
                continue
            reference = next((p for p in reading.points if abs(p.cap_w - caps[0]) < 0.5), None)
            if reference is None:
                continue
            kept, why = after_reference(caps, reference)
            if why is not None:
                probe.stopped[job_id] = why
            elif kept != caps:
                log.info("probe %s: %s kept above its low power level: %s", probe.id, job_id, kept)
                probe.jobs[job_id] = kept

    def _stop_below_floor(self, probe: Probe, level: int, readings: dict[str, Any]) -> None:
        """A job measured below its probe floor at this level, or with no period there, goes
        no lower."""
        mix = self.book.mix()
        index = {job.id: j for j, job in enumerate(mix.jobs)}
        for job_id, caps in probe.jobs.items():
            reading = readings.get(job_id)
            if reading is None or job_id in probe.stopped or job_id not in index:
                continue
            floor = self._floor(mix, index[job_id])
            at = next((p for p in reading.points if abs(p.cap_w - caps[level]) < 0.5), None)
            if at is None or level == 0:
                continue
            if at.relative_throughput is None:  # lower caps clip it flatter still
                probe.stopped[job_id] = (
                    f"no clear iteration period at {caps[level]:g} W ({at.no_period_reason}): "
                    "its throughput cannot be measured lower"
                )
            elif at.relative_throughput < floor:
                probe.stopped[job_id] = (
                    f"measured {at.relative_throughput:.3f} of its throughput at "
                    f"{caps[level]:g} W, below its probe floor {floor:g}"
                )

    def _desired(self, probe: Probe, level: int) -> dict[str, list[GpuCap]]:
        mix = self.book.mix()
        jobs = {job.id: job for job in mix.jobs}
        desired: dict[str, list[GpuCap]] = {}
        for job_id, caps in probe.jobs.items():
            job = jobs.get(job_id)
            if job is None or job_id in probe.stopped or level == 0 or job.protected:
                continue
            for where in job.placement or ():
                desired.setdefault(where.node, []).extend(
                    GpuCap(gpu=g, cap_w=caps[level]) for g in where.gpus
                )
        return desired

    def _plan(self, probe: Probe, level: int) -> dict[str, Any]:
        """The probe's level as a plan (the shape of GET /v1/plans/{id}): per job its cap and
        what its curve expects there, per node the caps."""
        desired = self._desired(probe, level)
        mix = self.book.mix()
        index = {job.id: j for j, job in enumerate(mix.jobs)}
        jobs, shed_w = [], 0.0
        for job_id, caps in probe.jobs.items():
            if job_id in probe.stopped or job_id not in index:
                continue
            j = index[job_id]
            job = mix.jobs[j]
            power, thr, _ = operating_point(mix.curves.select(slice(j, j + 1)), caps[level])
            shed_w += job.gpus * (job.power_w - float(power[0]))
            jobs.append(
                {
                    "id": job_id,
                    "cap_w": caps[level],
                    "power_w": float(power[0]),
                    "throughput": float(thr[0]),
                    "throughput_fraction": float(thr[0]) / job.throughput,
                    "min_throughput_fraction": job.min_throughput_fraction,
                }
            )
        expected_kw = mix.overhead_factor * max(shed_w, 0.0) / 1000.0
        return {
            "strategy": "probe",
            "probe_id": probe.id,
            "level": level,
            "step": probe.step,
            "feasible": True,
            "requested_facility_kw": 0.0,
            "achieved_facility_kw": expected_kw,
            "max_facility_kw": expected_kw,
            "shortfall_kw": 0.0,
            "jobs": jobs,
            "unplaced_jobs": [],
            "commands": [
                {"node": node, "caps": [c.model_dump() for c in desired.get(node, [])]}
                for node in sorted(self.fleet.nodes)
            ],
            # Static per-GPU caps are held by each GPU's firmware: they couple no jobs.
            "sync": {"loops": [], "verdict": "safe"},
        }

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
