"""The fleet: what the agents report, and what the site draws.

- **The agents** (`gateway.services.agentregistry`): which answer, which may cap, and which
  run simulated GPUs.
- **Telemetry rounds**: every reachable agent's telemetry, one round at a time. Readers get
  the last round while it is younger than `telemetry_max_age_s`, and up to twice that while
  the next round is under way, so readers (a dashboard, plan reads) do not queue behind a round
  of 1000 agents; older than that, they wait for the new round.
- **Site power**: the placed jobs' GPU power now (the mean of each GPU's recent samples) and
  the facility power the overhead model puts on it.
- **Phases** (`gateway.services.phasewatch`): each job's phase on the gateway's clock, read
  from each round, and the alarms over them.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from agents.protocol import GpuPower, JobTelemetry, TelemetryResponse
from flexmodel.jobs import JobMix
from flexmodel.phases import RayleighAlarm
from gateway.agentclient import AgentClient, KeptTelemetryClient
from gateway.clock import Clock
from gateway.services.agentregistry import AgentRegistry
from gateway.services.clocks import AgentClocks
from gateway.services.phasewatch import PhaseWatch
from gateway.settings import GatewaySettings
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso

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


class Fleet(AgentRegistry):
    def __init__(
        self, settings: GatewaySettings, store: Store, clock: Clock, client: AgentClient
    ) -> None:
        super().__init__(settings, store, clock, client)
        self.clocks = AgentClocks()
        self.phase_watch = PhaseWatch(clock, self.clocks)
        self._last: Telemetry | None = None
        self._last_at = -math.inf  #: when that round ended (monotonic)
        self._round: asyncio.Future[Telemetry] | None = None
        #: (telemetry, mix, power): `power` of that round and mix (the objects themselves)
        self._power: tuple[Telemetry, JobMix, FleetPower] | None = None

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

    @property
    def alarm(self) -> RayleighAlarm:
        return self.phase_watch.alarm

    @property
    def phases(self) -> dict[str, float]:
        """Each job's phase at the last watch [rad]."""
        return self.phase_watch.phases

    async def watch_phases(self) -> None:
        """The jobs' phases in the latest telemetry, and the Rayleigh alarm over them."""
        self.phase_watch.watch(await self.telemetry())

    async def phase_doc(self) -> dict[str, Any]:
        """The jobs' phases in the latest telemetry, as `PhaseWatch.doc` shows them."""
        telemetry = await self.telemetry()
        return self.phase_watch.doc(telemetry, job_readings(telemetry))
