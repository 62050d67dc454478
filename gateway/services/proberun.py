"""A probe run (`gateway.services.characterise`): its levels stepped in the order planned,
each sent as a plan through `Targets.probe`, held, and read; then every GPU restored and each
job's stretches fitted.

At the end of each step the agent's stretch at that step's cap (`JobTelemetry.stretches`, with
when it was measured) is recorded (`measured`). After the uncapped level, each job's caps are
kept above its communication level as measured there (`gateway.services.probecaps`: a cap
below it clips the power flat, with no period to measure). A job whose measured throughput
falls below its floor, or whose power shows no clear period at a level (the cap clips it
flat), goes no lower. At the end each job's recorded stretches are fitted with their drift
(`JobCurves.record_probe`; a job with none, from agents that do not report stretches, by its
agents' points as before). A target that takes over from the probe ends it at once.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.clock import Clock
from gateway.services.curves import JobCurves
from gateway.services.fleet import Fleet, job_readings
from gateway.services.jobbook import JobBook
from gateway.services.probe import Probe, level_caps, level_plan, probe_floor
from gateway.services.probecaps import after_reference, record_stretch
from gateway.services.targets import Targets
from gateway.settings import GatewaySettings

log = logging.getLogger("flexgate.gateway")
#: A probe looks this often whether an event took over (as a share of a level's hold).
WATCH_SLICES = 20


class ProbeRunner:
    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock,
        book: JobBook,
        fleet: Fleet,
        targets: Targets,
        curves: JobCurves,
    ) -> None:
        self.settings, self.clock, self.book, self.fleet = settings, clock, book, fleet
        self.targets, self.curves = targets, curves

    async def run(self, probe: Probe) -> None:
        """Step the probe's levels, then restore and fit; stops when a target takes over."""
        for step, level in enumerate(probe.steps):
            probe.step, probe.level = step, level
            mix = self.book.mix()
            caps = level_caps(probe, level, mix)
            plan = level_plan(probe, level, mix, caps, self.fleet.nodes)
            if not await self.targets.probe(probe.id, caps, plan):
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
            floor = probe_floor(mix.jobs[index[job_id]], self.settings)
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

    def _record_stretches(self, probe: Probe, level: int, readings: dict[str, Any]) -> None:
        """Each job's stretch at this step's cap (`record_stretch`)."""
        for job_id, caps in probe.jobs.items():
            reading = readings.get(job_id)
            if reading is None or (level and (job_id in probe.stopped or level >= len(caps))):
                continue
            taken = probe.measured.setdefault(job_id, [])
            record_stretch(taken, level, caps[level], reading.stretches)
