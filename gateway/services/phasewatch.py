"""The jobs' phases, watch after watch, and whether they lock.

- Each job's phase on the gateway's clock (`clocks.AgentClocks`: each agent's offset from its
  quickest answers), one vote per job however many nodes it spans.
- The Rayleigh alarm over them; below `MIN_JOBS_FOR_RAYLEIGH` jobs, each pair's phase-locking
  value over the last watches instead.

The telemetry they are read from: `gateway.services.fleet`.
"""

from __future__ import annotations

import cmath
import itertools
import math
from collections import deque
from typing import Any

from agents.protocol import JobTelemetry, TelemetryResponse
from flexmodel.phases import (
    MIN_JOBS_FOR_RAYLEIGH,
    RayleighAlarm,
    order_parameters,
    phase_locking_value,
    rayleigh_threshold,
)
from gateway.clock import Clock
from gateway.services.clocks import AgentClocks

#: The watches whose phases give each pair of jobs its phase-locking value.
WATCHES_KEPT = 16


class PhaseWatch:
    def __init__(self, clock: Clock, clocks: AgentClocks) -> None:
        self.clock, self.clocks = clock, clocks
        self.alarm = RayleighAlarm()
        self.phases: dict[str, float] = {}  #: job id -> phase [rad] at the last watch
        #: each watch's phases, all at one instant of the gateway's clock
        self.watches: deque[dict[str, float]] = deque(maxlen=WATCHES_KEPT)

    def aligned(self, telemetry: dict[str, TelemetryResponse]) -> dict[str, float]:
        """Each job's phase now on the gateway's clock [rad]: one per job, the circular mean
        of the nodes it spans (they agree when the offsets are right)."""
        now = self.clock.monotonic()
        seen: dict[str, list[complex]] = {}
        for node in sorted(telemetry):
            for job in telemetry[node].jobs:
                phase = self.clocks.phase_now(node, job, now)
                if phase is not None:
                    seen.setdefault(job.job_id, []).append(cmath.exp(1j * phase))
        return {
            job: cmath.phase(sum(votes)) % (2 * math.pi)
            for job, votes in seen.items()
            if abs(sum(votes)) > 1e-9
        }

    def watch(self, telemetry: dict[str, TelemetryResponse]) -> None:
        """The jobs' phases in this telemetry, and the Rayleigh alarm (three windows held)."""
        self.phases = self.aligned(telemetry)
        self.watches.append(self.phases)
        if len(self.phases) >= MIN_JOBS_FOR_RAYLEIGH:
            self.alarm.update(list(self.phases.values()))

    def pair_locking(self) -> list[dict[str, Any]]:
        """Each pair of jobs' phase-locking value over the watches that saw both, and whether
        it is above chance (the Rayleigh threshold for that many watches, split over the
        pairs). Two jobs at the same period keep their phase difference without coupling:
        a locked pair says they move together, not why."""
        jobs = sorted({job for watch in self.watches for job in watch})
        pairs = list(itertools.combinations(jobs, 2))
        out = []
        for a, b in pairs:
            both = [(w[a], w[b]) for w in self.watches if a in w and b in w]
            if len(both) < 2:
                continue
            plv = phase_locking_value([x for x, _ in both], [y for _, y in both])
            limit = rayleigh_threshold(len(both), self.alarm.false_alarm, len(pairs))
            out.append(
                {"jobs": [a, b], "plv": plv, "watches": len(both), "threshold": min(limit, 1.0)}
                | {"locked": len(both) >= MIN_JOBS_FOR_RAYLEIGH and plv > limit}
            )
        return out

    def doc(
        self, telemetry: dict[str, TelemetryResponse], readings: list[JobTelemetry]
    ) -> dict[str, Any]:
        """The jobs' phases on the gateway's clock (one vote per job, `readings` one per job),
        their order parameters, the agents' clock offsets and the alarm state."""
        aligned = self.aligned(telemetry)
        spans: dict[str, list[str]] = {}
        for node in sorted(telemetry):
            for job in telemetry[node].jobs:
                spans.setdefault(job.job_id, []).append(node)
        phases = list(aligned.values())
        order = None
        if phases:
            r1, r2, r3 = (float(v) for v in order_parameters(phases))
            order = {"r1": r1, "r2": r2, "r3": r3, "jobs": len(phases)}
        return {
            "jobs": [
                {
                    "job_id": j.job_id,
                    "period_s": j.period_s,
                    "duty": j.duty,
                    "phase": aligned.get(j.job_id),
                    "nodes": spans.get(j.job_id, []),
                }
                for j in readings
            ],
            "order_parameters": order,
            "alarms": self._alarms(len(phases)),
            "clocks": self._offsets(telemetry),
        }

    def _alarms(self, jobs: int) -> dict[str, Any]:
        """The Rayleigh test's state over `jobs` phases, or each pair's locking below
        `MIN_JOBS_FOR_RAYLEIGH` jobs."""
        if jobs >= MIN_JOBS_FOR_RAYLEIGH:
            return {
                "test": "rayleigh",
                "threshold": rayleigh_threshold(jobs, self.alarm.false_alarm),
                "false_alarm": self.alarm.false_alarm,
                "held_windows": self.alarm.hold,
                "harmonics": [
                    m
                    for m, streak in zip((1, 2, 3), self.alarm.streak, strict=True)
                    if streak >= self.alarm.hold
                ],
            }
        pairs = self.pair_locking()
        return {
            "test": "phase-locking-value",
            "harmonics": [],
            "note": f"fewer than {MIN_JOBS_FOR_RAYLEIGH} jobs with phases: each pair's "
            "phase-locking value over the last watches stands in for the Rayleigh test",
            "pairs": pairs,
            "locked_pairs": [p["jobs"] for p in pairs if p["locked"]],
        }

    def _offsets(self, telemetry: dict[str, TelemetryResponse]) -> dict[str, Any]:
        """Each reporting agent's clock offset from the gateway's, and its error [s]."""
        clocks = {}
        for node in sorted(telemetry):
            offset = self.clocks.offset(node)
            clocks[node] = (
                None if offset is None else {"offset_s": offset.offset_s, "error_s": offset.error_s}
            )
        return clocks
