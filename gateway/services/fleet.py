"""The fleet: which agents answer, what they report, and what the site draws.

- **Discovery**: each configured agent address is asked who it is until it answers; its node
  id is remembered (and stored, with when it was last seen).
- **Telemetry rounds**: every reachable agent's telemetry, one round at a time. Readers get
  the last round while it is younger than `telemetry_max_age_s`, and up to twice that while
  the next round is under way, so readers (a dashboard, plan reads) do not queue behind a round
  of 1000 agents; older than that, they wait for the new round.
- **Site power**: the placed jobs' GPU power now (the mean of each GPU's recent samples) and
  the facility power the overhead model puts on it.
- **Phases**: each job's phase, one vote per job, and the Rayleigh alarm over them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agents.protocol import GpuPower, Health, JobTelemetry, TelemetryResponse
from flexmodel.jobs import JobMix
from flexmodel.phases import (
    MIN_JOBS_FOR_RAYLEIGH,
    RayleighAlarm,
    order_parameters,
    rayleigh_threshold,
)
from gateway.agentclient import Ack, AgentClient, AgentUnreachableError
from gateway.clock import Clock
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso

log = logging.getLogger("flexgate.gateway")
Telemetry = dict[str, TelemetryResponse]  #: node id -> its agent's last answer


@dataclass(frozen=True)
class FleetPower:
    gpu_kw: float  #: the placed jobs' GPU power now, measured by the agents
    baseline_gpu_kw: float  #: the placed jobs' GPU power uncapped (declared)
    max_gpu_kw: float  #: the placed jobs' GPUs all at their maximum limit
    nodes_reporting: int


def mean_power_w(gpu: GpuPower) -> float | None:
    """A GPU's power over its recent samples [W], None without samples."""
    return sum(gpu.power_w) / len(gpu.power_w) if gpu.power_w else None


def job_readings(telemetry: Telemetry) -> list[JobTelemetry]:
    """One reading per job (a job spanning nodes is reported by each: the first counts)."""
    seen: dict[str, JobTelemetry] = {}
    for node in sorted(telemetry):
        for job in telemetry[node].jobs:
            seen.setdefault(job.job_id, job)
    return list(seen.values())


class Fleet:
    def __init__(
        self, settings: GatewaySettings, store: Store, clock: Clock, client: AgentClient
    ) -> None:
        self.settings, self.store, self.clock, self.client = settings, store, clock, client
        self.nodes: dict[str, str] = {}  #: node id -> agent address
        self.version = 0  #: rises when a node is found, or the unreachable ones change
        self.seen: dict[str, datetime] = {}  #: node id -> when it last answered
        #: node id -> why it is unreachable: its last command failed (after the retries). The
        #: one definition, used by plans (`unreachable_nodes`), /v1/nodes, quotes and metrics.
        self.unreachable: dict[str, str] = {}
        self.alarm = RayleighAlarm()
        self.phases: dict[str, float] = {}  #: job id -> phase [rad] at the last watch
        self._last: Telemetry | None = None
        self._last_at = -math.inf  #: when that round ended (monotonic)
        self._round: asyncio.Future[Telemetry] | None = None

    async def discover(self) -> None:
        """Ask each configured agent that has not answered yet for its node id; those that
        answer are stored in one transaction (one commit per node would hold the event loop
        for seconds at 10,000 nodes, and the answers still in flight would time out)."""
        known = set(self.nodes.values())
        missing = [a for a in self.settings.agent_urls if a not in known]
        answers = await asyncio.gather(*(self._ask(address) for address in missing))
        found = [(a, health) for a, health in zip(missing, answers, strict=True) if health]
        if not found:
            return
        now = self.clock.now()
        for address, health in found:
            self.nodes[health.node_id] = address
            self.seen[health.node_id] = now
        self.version += 1
        with self.store.session() as s:
            for address, health in found:
                repo.saw_node(s, node_id=health.node_id, url=address, at=now)
            s.commit()

    async def _ask(self, address: str) -> Health | None:
        try:
            return await self.client.health(address)
        except AgentUnreachableError as exc:
            log.warning("agent %s did not answer: %s", address, exc)
            return None

    def note_answers(self, acks: list[Ack]) -> bool:
        """Record which nodes failed their command and why; True when the set changed."""
        unreachable = {a.node: a.error or "no answer" for a in acks if a.failed}
        changed = set(unreachable) != set(self.unreachable)
        self.unreachable = unreachable
        if changed:
            self.version += 1
            log.warning("nodes unreachable: %s", ", ".join(sorted(unreachable)) or "none")
        return changed

    @property
    def last(self) -> Telemetry | None:
        """The last round of telemetry, without asking for a new one."""
        return self._last

    def stop(self) -> None:
        if self._round is not None:
            self._round.cancel()

    async def telemetry(self) -> Telemetry:
        """Each reachable agent's telemetry, by node (see the module's docstring)."""
        max_age = self.settings.telemetry_max_age_s
        age = self.clock.monotonic() - self._last_at
        if age >= max_age and (self._round is None or self._round.done()):
            self._round = asyncio.ensure_future(self._ask_telemetry())
            self._round.add_done_callback(self._keep)
        if self._last is not None and age < 2 * max_age:
            return self._last
        assert self._round is not None
        return await asyncio.shield(self._round)

    def _keep(self, round_: asyncio.Future[Telemetry]) -> None:
        if not round_.cancelled() and round_.exception() is None:
            self._last, self._last_at = round_.result(), self.clock.monotonic()
            self.seen.update(dict.fromkeys(self._last, self.clock.now()))

    async def _ask_telemetry(self) -> Telemetry:
        nodes = list(self.nodes.items())
        found = await asyncio.gather(*(self.client.telemetry(a) for _, a in nodes))
        return {node: doc for (node, _), doc in zip(nodes, found, strict=True) if doc is not None}

    async def power(self, mix: JobMix) -> FleetPower:
        """What the placed jobs' GPUs draw now, by the agents' recent samples; the baseline
        and maximum count only the jobs whose every node reports (a job on a silent node can
        be neither measured nor capped, so it is not part of what the site sheds from)."""
        telemetry = await self.telemetry()
        measured_w = baseline_w = max_w = 0.0
        for job in mix.placed:
            assert job.placement is not None
            if not all(where.node in telemetry for where in job.placement):
                continue
            baseline_w += job.gpus * job.power_w
            max_w += job.gpus * job.max_cap_w
            for where in job.placement:
                gpus = {g.index: mean_power_w(g) for g in telemetry[where.node].gpus}
                measured_w += sum(gpus.get(g) or 0.0 for g in where.gpus)
        return FleetPower(measured_w / 1000.0, baseline_w / 1000.0, max_w / 1000.0, len(telemetry))

    async def watch_phases(self) -> None:
        """The jobs' phases from the agents, and the Rayleigh alarm (three windows held)."""
        readings = job_readings(await self.telemetry())
        self.phases = {j.job_id: j.phase_rad for j in readings if j.phase_rad is not None}
        if len(self.phases) >= MIN_JOBS_FOR_RAYLEIGH:
            self.alarm.update(list(self.phases.values()))

    async def node_docs(self) -> list[dict[str, Any]]:
        """Every node ever seen: reachable now or not (and why not), whether its telemetry
        answers, its GPUs' power, delays and jobs."""
        telemetry = await self.telemetry()
        with self.store.session() as s:
            known = repo.list_nodes(s)
        out = []
        for row in known:
            report = telemetry.get(row.node_id)
            out.append(
                {
                    "node": row.node_id,
                    "url": row.url,
                    "reachable": row.node_id in self.nodes and row.node_id not in self.unreachable,
                    "unreachable_reason": self.unreachable.get(row.node_id)
                    or (None if row.node_id in self.nodes else "has not answered since start"),
                    "reporting": report is not None,  #: its telemetry answered
                    # Kept in memory, not stored on every round: the store has the first answer.
                    "last_seen": iso(self.seen.get(row.node_id, row.last_seen)),
                    "gpus": [
                        {"index": g.index, "power_w": mean_power_w(g)}
                        for g in (report.gpus if report else [])
                    ],
                    "actuation_delay": report.actuation_delay.model_dump() if report else None,
                    "jobs": [j.model_dump() for j in report.jobs] if report else [],
                }
            )
        return out

    async def phase_doc(self) -> dict[str, Any]:
        """The jobs' phases (one vote per job), their order parameters and the alarm state."""
        readings = job_readings(await self.telemetry())
        phases = [j.phase_rad for j in readings if j.phase_rad is not None]
        order = None
        if phases:
            r1, r2, r3 = (float(v) for v in order_parameters(phases))
            order = {"r1": r1, "r2": r2, "r3": r3, "jobs": len(phases)}
        if len(phases) >= MIN_JOBS_FOR_RAYLEIGH:
            alarms: dict[str, Any] = {
                "test": "rayleigh",
                "threshold": rayleigh_threshold(len(phases), self.alarm.false_alarm),
                "false_alarm": self.alarm.false_alarm,
                "held_windows": self.alarm.hold,
                "harmonics": [
                    m
                    for m, streak in zip((1, 2, 3), self.alarm.streak, strict=True)
                    if streak >= self.alarm.hold
                ],
            }
        else:
            alarms = {
                "test": None,
                "harmonics": [],
                "note": f"fewer than {MIN_JOBS_FOR_RAYLEIGH} jobs with phases: the Rayleigh "
                "test does not apply (use pairwise phase-locking values)",
            }
        return {
            "jobs": [
                {"job_id": j.job_id, "period_s": j.period_s, "duty": j.duty, "phase": j.phase_rad}
                for j in readings
            ],
            "order_parameters": order,
            "alarms": alarms,
        }
