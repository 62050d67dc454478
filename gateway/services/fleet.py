"""The fleet: which agents answer, what they report, and what the site draws.

- **Discovery**: each configured agent address is asked who it is until it answers; its node
  id is remembered (and stored, with when it was last seen).
- **Nodes that cannot cap**: an agent whose health or last answer says `can_cap: false` (NVML
  refused it a set for permission) is kept in `cannot_cap` with its reason; plans and quotes
  leave its GPUs out, as they do a silent node's.
- **Telemetry rounds**: every reachable agent's telemetry, one round at a time. Readers get
  the last round while it is younger than `telemetry_max_age_s`, and up to twice that while
  the next round is under way, so readers (a dashboard, plan reads) do not queue behind a round
  of 1000 agents; older than that, they wait for the new round.
- **Site power**: the placed jobs' GPU power now (the mean of each GPU's recent samples) and
  the facility power the overhead model puts on it.
- **Phases**: each job's phase on the gateway's clock (`clocks.AgentClocks`: each agent's
  offset from its quickest answers), one vote per job however many nodes it spans, and the
  Rayleigh alarm over them; below `MIN_JOBS_FOR_RAYLEIGH` jobs, each pair's phase-locking
  value over the last watches instead.
"""

from __future__ import annotations

import asyncio
import cmath
import itertools
import logging
import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agents.protocol import GpuPower, Health, JobTelemetry, TelemetryResponse
from flexmodel.jobs import JobMix
from flexmodel.phases import (
    MIN_JOBS_FOR_RAYLEIGH,
    RayleighAlarm,
    order_parameters,
    phase_locking_value,
    rayleigh_threshold,
)
from gateway.agentclient import Ack, AgentClient, AgentUnreachableError, KeptTelemetryClient
from gateway.clock import Clock
from gateway.services.clocks import AgentClocks
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso

log = logging.getLogger("flexgate.gateway")
#: The watches whose phases give each pair of jobs its phase-locking value.
WATCHES_KEPT = 16
Telemetry = dict[str, TelemetryResponse]  #: node id -> its agent's last answer


@dataclass(frozen=True)
class FleetPower:
    gpu_kw: float  #: the placed jobs' GPU power now, measured by the agents
    baseline_gpu_kw: float  #: the placed jobs' GPU power uncapped (declared)
    max_gpu_kw: float  #: the placed jobs' GPUs all at their maximum limit
    nodes_reporting: int
    #: how long a stretch of samples each GPU's power is the mean of, averaged over the GPUs
    #: measured [s]: a step of the GPUs shows in `gpu_kw` over this long
    span_s: float = 0.0
    #: when the telemetry round it comes from ended (monotonic) [s]: its samples end there
    at_s: float | None = None
    #: every reporting GPU's power, placed or not: idle GPUs, and a job that started before
    #: the scheduler reported it [kW]
    all_gpu_kw: float = 0.0


@dataclass(frozen=True)
class LoopMeasurements:
    """What the sync verdicts judge the site's loops on: the jobs' periods and duties as the
    agents measure them under the present caps, and the delays as measured."""

    periods_s: dict[str, float]  #: job id -> iteration period under its caps [s]
    duties: dict[str, float]  #: job id -> compute share
    dispatch_s: tuple[float, ...] = ()  #: the last commands' round trips [s]
    actuation_s: tuple[float, ...] = ()  #: the agents' latest actuation delays [s]


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
        #: node id -> its agent's GPU backend (`sim` or `nvml`), as its health said
        self.backends: dict[str, str] = {}
        #: node id -> its GPUs' power sensor's effective lag, as the agent models it [s]
        self.sensor_lags_s: dict[str, float] = {}
        #: node id -> why it is unreachable: its last command failed (after the retries). The
        #: one definition, used by plans (`unreachable_nodes`), /v1/nodes, quotes and metrics.
        self.unreachable: dict[str, str] = {}
        #: node id -> why its agent may not set limits (its `can_cap` false, with the reason)
        self.cannot_cap: dict[str, str] = {}
        self.dispatch_s: tuple[float, ...] = ()  #: the last commands' round trips [s]
        self.alarm = RayleighAlarm()
        self.clocks = AgentClocks()
        self.phases: dict[str, float] = {}  #: job id -> phase [rad] at the last watch
        #: each watch's phases, all at one instant of the gateway's clock
        self.watches: deque[dict[str, float]] = deque(maxlen=WATCHES_KEPT)
        self._last: Telemetry | None = None
        self._last_at = -math.inf  #: when that round ended (monotonic)
        self._round: asyncio.Future[Telemetry] | None = None
        #: (telemetry, mix, power): `power` of that round and mix (the objects themselves)
        self._power: tuple[Telemetry, JobMix, FleetPower] | None = None

    def simulated(self) -> list[str]:
        """The nodes whose agents run simulated GPUs, sorted."""
        return sorted(node for node, kind in self.backends.items() if kind == "sim")

    def simulated_refusal(self) -> str | None:
        """Why no plan may rest on this fleet, or None: outside the lab (and unless the site is
        simulated on purpose, FLEXGATE_ALLOW_SIMULATED), a node on simulated GPUs caps nothing
        real, and without a meter the shed would be computed from the simulated power."""
        sim = self.simulated()
        if not sim or self.settings.lab or self.settings.allow_simulated:
            return None
        shown = ", ".join(sim[:3]) + (f" and {len(sim) - 3} more" if len(sim) > 3 else "")
        return (
            f"{len(sim)} node(s) run simulated GPUs (backend sim: {shown}): their caps reach no "
            "real GPU; start their agents with --backend nvml, or set "
            "FLEXGATE_ALLOW_SIMULATED=true for a simulated site"
        )

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
            self.backends[health.node_id] = health.backend
            if health.sensor is not None:
                self.sensor_lags_s[health.node_id] = health.sensor.lag_s
            self._note_can_cap(health.node_id, health.can_cap, health.can_cap_reason)
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
        """Record which nodes failed their command and why, and which may not set limits;
        True when either set changed."""
        unreachable = {a.node: a.error or "no answer" for a in acks if a.failed}
        self.dispatch_s = tuple(a.delay_s for a in acks if a.delay_s is not None)
        before = set(self.cannot_cap)
        for ack in acks:
            if ack.answer is not None:
                self._note_can_cap(ack.node, ack.answer.can_cap, ack.answer.can_cap_reason)
        changed = set(unreachable) != set(self.unreachable)
        self.unreachable = unreachable
        if changed:
            log.warning("nodes unreachable: %s", ", ".join(sorted(unreachable)) or "none")
        if set(self.cannot_cap) != before:
            changed = True
            log.warning("nodes that may not set limits: %s", ", ".join(self.cannot_cap) or "none")
        if changed:
            self.version += 1
        return changed

    def _note_can_cap(self, node: str, can_cap: bool | None, reason: str | None) -> None:
        if can_cap is False:
            self.cannot_cap[node] = reason or "its agent may not set power limits"
        else:  # true, or unknown: an agent restarted with the permission has not set yet
            self.cannot_cap.pop(node, None)

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
            before = dict(self.cannot_cap)
            for node, report in self._last.items():
                if report.can_cap is not None:  # NATS summaries and older agents do not say
                    self._note_can_cap(node, report.can_cap, report.can_cap_reason)
            if self.cannot_cap != before:  # an agent restarted with the permission, or lost it
                self.version += 1

    async def _ask_telemetry(self) -> Telemetry:
        nodes = list(self.nodes.items())
        if isinstance(self.client, KeptTelemetryClient):  # nothing to ask: read what is kept
            kept = self.client.kept_telemetry([a for _, a in nodes])
            found = []
            for (node, _), one in zip(nodes, kept, strict=True):
                if one is not None and one[1].agent_time_s is not None:
                    self.clocks.observe_published(node, one[1].agent_time_s, one[0])
                found.append(None if one is None else one[1])
        else:
            found = await asyncio.gather(*(self._ask_one(node, a) for node, a in nodes))
        return {node: doc for (node, _), doc in zip(nodes, found, strict=True) if doc is not None}

    async def _ask_one(self, node: str, address: str) -> TelemetryResponse | None:
        asked = self.clock.monotonic()
        doc = await self.client.telemetry(address)
        if doc is not None and doc.agent_time_s is not None:
            self.clocks.observe(node, asked, doc.agent_time_s, self.clock.monotonic())
        return doc

    def loop_measurements(self) -> LoopMeasurements:
        """The last round's measured periods, duties and delays (no new round is asked)."""
        telemetry = self._last or {}
        readings = job_readings(telemetry)
        return LoopMeasurements(
            periods_s={j.job_id: j.period_s for j in readings if j.period_s},
            duties={j.job_id: j.duty for j in readings if j.duty},
            dispatch_s=self.dispatch_s,
            actuation_s=tuple(
                d for report in telemetry.values() for d in report.actuation_delay.recent_s
            ),
        )

    async def pod_gpus(self) -> dict[tuple[str, str, str], tuple[int, ...]]:
        """Each Kubernetes pod's GPU indices, as its node's agent reads them from the kubelet:
        (node, namespace, pod) -> indices."""
        return {
            (node, pod.namespace, pod.name): tuple(pod.gpus)
            for node, telemetry in (await self.telemetry()).items()
            for pod in telemetry.pods or ()
        }

    async def power(self, mix: JobMix) -> FleetPower:
        """What the placed jobs' GPUs draw now, by the agents' recent samples; the baseline
        and maximum count only the jobs whose every node reports (a job on a silent node can
        be neither measured nor capped, so it is not part of what the site sheds from).
        Worked out once per round of telemetry and job mix: every plan read and site read
        asks for it, and at 1,000 jobs it is a loop over 8,000 GPUs."""
        telemetry = await self.telemetry()
        if self._power is not None and self._power[0] is telemetry and self._power[1] is mix:
            return self._power[2]
        measured_w = baseline_w = max_w = 0.0
        spans_s: list[float] = []
        for job in mix.placed:
            assert job.placement is not None
            if not all(where.node in telemetry for where in job.placement):
                continue
            baseline_w += job.gpus * job.power_w
            max_w += job.gpus * job.max_cap_w
            for where in job.placement:
                gpus = {g.index: g for g in telemetry[where.node].gpus}
                for index in where.gpus:
                    gpu = gpus.get(index)
                    if gpu is not None and gpu.power_w:
                        measured_w += sum(gpu.power_w) / len(gpu.power_w)
                        spans_s.append(len(gpu.power_w) * gpu.sample_interval_s)
        span_s = sum(spans_s) / len(spans_s) if spans_s else 0.0
        at_s = self._last_at if telemetry is self._last else self.clock.monotonic()
        all_w = sum(
            sum(gpu.power_w) / len(gpu.power_w)
            for report in telemetry.values()
            for gpu in report.gpus
            if gpu.power_w
        )
        power = FleetPower(
            measured_w / 1000.0,
            baseline_w / 1000.0,
            max_w / 1000.0,
            len(telemetry),
            span_s,
            at_s,
            all_w / 1000.0,
        )
        self._power = (telemetry, mix, power)
        return power

    def aligned_phases(self, telemetry: Telemetry) -> dict[str, float]:
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

    async def watch_phases(self) -> None:
        """The jobs' phases from the agents, and the Rayleigh alarm (three windows held)."""
        self.phases = self.aligned_phases(await self.telemetry())
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
                    #: `sim` or `nvml`; null until the agent answers after a gateway start
                    "backend": self.backends.get(row.node_id),
                    "reachable": row.node_id in self.nodes and row.node_id not in self.unreachable,
                    "unreachable_reason": self.unreachable.get(row.node_id)
                    or (None if row.node_id in self.nodes else "has not answered since start"),
                    #: why its agent may not set limits (its can_cap false), else null
                    "cannot_cap_reason": self.cannot_cap.get(row.node_id),
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
        """The jobs' phases on the gateway's clock (one vote per job), their order parameters,
        the agents' clock offsets and the alarm state."""
        telemetry = await self.telemetry()
        readings = job_readings(telemetry)
        aligned = self.aligned_phases(telemetry)
        spans: dict[str, list[str]] = {}
        for node in sorted(telemetry):
            for job in telemetry[node].jobs:
                spans.setdefault(job.job_id, []).append(node)
        phases = list(aligned.values())
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
            pairs = self.pair_locking()
            alarms = {
                "test": "phase-locking-value",
                "harmonics": [],
                "note": f"fewer than {MIN_JOBS_FOR_RAYLEIGH} jobs with phases: each pair's "
                "phase-locking value over the last watches stands in for the Rayleigh test",
                "pairs": pairs,
                "locked_pairs": [p["jobs"] for p in pairs if p["locked"]],
            }
        clocks = {}
        for node in sorted(telemetry):
            offset = self.clocks.offset(node)
            clocks[node] = (
                None if offset is None else {"offset_s": offset.offset_s, "error_s": offset.error_s}
            )
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
            "alarms": alarms,
            "clocks": clocks,
        }
