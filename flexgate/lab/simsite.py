"""A whole site in one process, on a stepped clock: for the closed-loop tests and benchmark.

The truth and the belief differ, as on a real site: the simulated agents run the true job mix
(`truth`), the gateway's services plan on the declared one (`declared`), and a simulated
facility meter reads the agents' true GPU power through the true static load, overhead factor
and cooling lag. Nothing waits: every `tick` samples the meter and the site once and steps
the clock by one meter period, so an hour of an event takes a second or two.

`draw_truth` makes a mismatched truth from a declared mix, by the study's predictor error and
the spreads a site sees (docs/gateway.md, "The closed site loop").

For phase-locking (`flexgate.lab.lock`) the meter can read the GPUs' instantaneous power (the
jobs' swings, not their means: `waveform`) a dead time late (`delay_s`), and the agents sample
their GPUs (`sample_hz`), so the gateway measures the jobs' phases; every reconciliation period
the site then watches them, lets the scatterer act and renews the leases, as the reconciler.
`in_step_ids` names jobs that the simulated backend starts in step (a fleet locked from the
start, for scattering's tests and benchmark).
"""

from __future__ import annotations

import asyncio
import copy
import math
import tempfile
import zlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from agents.service import AgentNode
from agents.simulated import SimulatedBackend
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import DEFAULT_MAX_CAP_W
from flexmodel.sensors import SensorModel
from gateway.agentclient.memory import InMemoryAgentClient
from gateway.clock import SteppedClock
from gateway.errors import MeterError
from gateway.meter import MeterFeed
from gateway.services.delivery import Deliveries
from gateway.services.fleet import Fleet
from gateway.services.jobbook import JobBook
from gateway.services.oscillation import OscillationWatch
from gateway.services.overhead import Overhead
from gateway.services.scattering import Scatterer
from gateway.services.site import SitePower
from gateway.services.targets import Targets
from gateway.services.tracking import Tracker
from gateway.settings import GatewaySettings
from gateway.store.db import Store

#: The mismatch `draw_truth` draws (one standard deviation or the bound of a uniform draw).
PFI_RMSE = 0.27  #: the study's PFI predictor error, 0.24-0.30
POWER_SPREAD = 0.15  #: uncapped power per GPU, up to +-15% of the declared
DUTY_SPREAD = 0.1  #: duty, up to +-0.1
OVERHEAD_SPREAD = 0.15  #: the overhead factor, up to +-0.15


def in_step_ids(count: int, within: float = 0.02) -> list[str]:
    """`count` job ids whose simulated starting phases (`agents.simjobs.job_phase`, drawn
    from the id) lie within `within` of a cycle of each other."""
    found: list[str] = []
    k = 0
    while len(found) < count:
        name = f"job-{k}"
        if zlib.crc32(name.encode()) / 2**32 < within:
            found.append(name)
        k += 1
    return found


@dataclass(frozen=True)
class Truth:
    jobs: list[dict[str, Any]]
    overhead_factor: float
    static_kw: float


def draw_truth(
    declared: list[dict[str, Any]],
    *,
    overhead_factor: float,
    static_kw: float,
    rng: np.random.Generator,
) -> Truth:
    """The site as it really is, drawn away from what was declared."""
    jobs = copy.deepcopy(declared)
    for job in jobs:
        drawn = job["power_w"] * (1 + rng.uniform(-POWER_SPREAD, POWER_SPREAD))
        # A GPU cannot draw more than its limit on average: the truth stays below it.
        job["power_w"] = round(min(drawn, 0.98 * job.get("max_cap_w", DEFAULT_MAX_CAP_W)), 1)
        if "pfi" in job:
            job["pfi"] = round(float(np.clip(job["pfi"] + rng.normal(0, PFI_RMSE), 1.05, 3.0)), 3)
        duty = job.get("duty", 0.8) + rng.uniform(-DUTY_SPREAD, DUTY_SPREAD)
        job["duty"] = round(float(np.clip(duty, 0.3, 0.95)), 3)
    k = overhead_factor + rng.uniform(-OVERHEAD_SPREAD, OVERHEAD_SPREAD)
    return Truth(jobs, max(round(float(k), 3), 1.0), static_kw)


class SimulatedMeter:
    """The facility meter of a simulated site: static load + k * (the GPUs' true mean power,
    through a first-order cooling lag) + noise; `fault` makes it stop, read NaN or jump, and
    `freeze` holds its reading (a stuck register: fresh timestamps, one value)."""

    source = "sim://facility"

    def __init__(
        self,
        backends: list[SimulatedBackend],
        clock: SteppedClock,
        truth: Truth,
        *,
        time_constant_s: float,
        noise_kw: float,
        seed: int,
        waveform: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        self.backends, self.clock, self.truth = backends, clock, truth
        self.time_constant_s, self.noise_kw = time_constant_s, noise_kw
        self.waveform, self.delay_s = waveform, delay_s
        self.rng = np.random.default_rng(seed)
        self.fault: str | None = None  #: None, "stop", "nan", "jump" or "freeze"
        self._frozen_kw = 0.0
        self._lagged_kw = self.gpu_kw()
        self._at_s = clock.monotonic()
        self._history: list[tuple[float, float]] = []  #: (time, lagged kW) for the delay

    def gpu_kw(self) -> float:
        """The GPUs' power now: their means over an iteration, or with `waveform` what they
        draw this instant [kW]."""
        read = (lambda b, i: b.power_w(i)) if self.waveform else (lambda b, i: b.mean_power_w(i))
        return sum(read(b, i) for b in self.backends for i in range(b.count())) / 1000.0

    def true_facility_kw(self) -> float:
        """The facility power now, without the lag or the noise."""
        return self.truth.static_kw + self.truth.overhead_factor * self.gpu_kw()

    def freeze(self, offset_kw: float = 0.0) -> None:
        """From now on the meter reads the true facility power now, plus `offset_kw`, unchanged."""
        self.fault, self._frozen_kw = "freeze", self.true_facility_kw() + offset_kw

    async def read_kw(self) -> float:
        now_s = self.clock.monotonic()
        dt_s, self._at_s = now_s - self._at_s, now_s
        blend = 1.0 - math.exp(-dt_s / self.time_constant_s) if self.time_constant_s else 1.0
        self._lagged_kw += blend * (self.gpu_kw() - self._lagged_kw)
        if self.fault == "stop":
            raise MeterError("the simulated meter does not answer")
        if self.fault == "nan":
            return math.nan
        if self.fault == "freeze":
            return self._frozen_kw
        self._history.append((now_s, self._lagged_kw))
        while len(self._history) > 1 and self._history[1][0] <= now_s - self.delay_s:
            self._history.pop(0)  # the first one left is the reading `delay_s` ago
        reading = self.truth.static_kw + self.truth.overhead_factor * self._history[0][1]
        reading += float(self.rng.normal(0.0, self.noise_kw)) if self.noise_kw else 0.0
        return reading * (3.0 if self.fault == "jump" else 1.0)

    async def aclose(self) -> None:
        return None


class SimulatedSite:
    """Agents, meter and the gateway's services; `await site.start()` before use."""

    def __init__(
        self,
        declared: list[dict[str, Any]],
        truth: Truth,
        *,
        declared_overhead_factor: float,
        tracking: bool = True,
        meter_period_s: float = 1.0,
        time_constant_s: float = 3.0,
        noise_kw: float = 0.0,
        gpus_per_node: int = 8,
        seed: int = 0,
        folder: Path | None = None,
        waveform_meter: bool = False,
        meter_delay_s: float = 0.0,
        sample_hz: float = 0.0,
        read_power: bool = False,
        metered: bool = True,
        sensor: SensorModel | None = None,
        start: datetime | None = None,
        **settings: Any,
    ) -> None:
        """`settings` override the gateway's (FLEXGATE_ names without the prefix). With
        `sample_hz` the agents sample their GPUs (phases; the meter period must be a whole
        number of samples), and reconciliation rounds run. Without it, `read_power`: the
        agents read their GPUs' power at 10 Hz all the same (their telemetry's mean is over
        the last 10 s), but measure no phases and no rounds run (cheaper, for long runs).
        Not `metered`, the gateway is given no meter and estimates the facility from the
        agents' power (the loop closes on that estimate); the simulated meter still reads the
        truth for the caller. `sensor`: the GPUs' power sensor the agents read through
        (`flexmodel.sensors`; None: none). `start`: the wall clock's first instant (default
        `SteppedClock`'s)."""
        self.clock = SteppedClock(start)
        self.folder = folder or Path(tempfile.mkdtemp(prefix="flexgate-simsite-"))
        self.declared, self.truth = declared, truth
        self.sample_hz, self.read_power = sample_hz, read_power
        self._simulate_nodes(gpus_per_node, seed, sensor)
        self.settings = GatewaySettings(
            database_url=f"sqlite:///{self.folder / 'gateway.db'}",
            lab=True,
            agents=",".join(self.nodes),
            overhead_factor=declared_overhead_factor,
            meter_period_s=meter_period_s,
            meter_dead_s=meter_delay_s,  # the meter's path, as a calibration identifies it
            meter_lag_s=time_constant_s,
            calibrate=False,
            tracking=tracking,
            **settings,
        )
        self.meter = SimulatedMeter(
            self.backends,
            self.clock,
            truth,
            time_constant_s=time_constant_s,
            noise_kw=noise_kw,
            seed=seed,
            waveform=waveform_meter,
            delay_s=meter_delay_s,
        )
        self._wire(metered)

    def _simulate_nodes(self, gpus_per_node: int, seed: int, sensor: SensorModel | None) -> None:
        """The simulated nodes running the truth (`backends`) and an agent on each (`nodes`,
        by its `mem://` address)."""
        self.backends = _backends(self.truth, gpus_per_node, self.clock, seed, sensor)
        self.nodes = {
            # No sampling thread (the meter reads the GPUs) and a short window: cheap telemetry.
            f"mem://{b.node_id}": AgentNode(
                b.node_id,
                b,
                self.folder / b.node_id,
                jobs={j.id: j.gpus for j in b.jobs} if self.sample_hz else None,
                clock=self.clock.monotonic,
                sample_hz=self.sample_hz,  # sampled by `tick`: no thread
                window_s=12.0 if self.sample_hz or self.read_power else 1.0,
            )
            for b in self.backends
        }

    def _wire(self, metered: bool) -> None:
        """The gateway's services on the stepped clock, as the gateway's app wires them; the
        first reconciliation round due."""
        settings, clock = self.settings, self.clock
        self._next_round_s = clock.monotonic() + settings.reconcile_period_s
        self.client = InMemoryAgentClient(self.nodes, clock)
        self.store = Store(settings.database_url)
        self.fleet = Fleet(settings, self.store, clock, self.client)
        overhead = Overhead(settings, self.store, clock)
        self.book = JobBook(self.store, clock, overhead)
        self.feed = MeterFeed(
            self.meter,
            clock=clock,
            period_s=settings.meter_period_s,
            max_step_kw=settings.meter_max_step_kw,
            max_kw=settings.meter_max_kw,
        )
        self.power = SitePower(
            settings, clock, self.fleet, self.book, overhead, self.feed if metered else None
        )
        self.targets = Targets(
            settings, self.store, clock, self.client, self.fleet, self.book, self.power
        )
        self.tracker = Tracker(settings, clock, self.power, self.targets, self.book, self.fleet)
        self.power.subscribe(self.tracker.step)
        self.power.subscribe(Deliveries(self.store, clock, self.power, self.tracker).sample)
        self.oscillation = OscillationWatch(settings, self.power, self.fleet, self.book)
        self.scatterer = Scatterer(
            settings, clock, self.fleet, self.targets, self.tracker, self.oscillation
        )

    async def start(self) -> None:
        await self.book.replace(self.declared, "simulation")
        await self.fleet.discover()

    def close(self) -> None:
        self.store.close()

    async def tick(self) -> float | None:
        """One meter period: the meter read, the site sampled (the loop steps), time moves on.
        The meter's believed reading [kW]."""
        await self.feed.sample()
        await self.power.sample()
        reading = self.feed.believed_kw()
        if self.sample_hz:
            await self._sample_agents()
        else:
            self._read_power()
        await asyncio.sleep(0)
        return reading

    def _read_power(self) -> None:
        """One meter period; with `read_power`, the agents reading their GPUs' power at
        10 Hz through it."""
        period_s = self.settings.meter_period_s
        if not self.read_power:
            self.clock.step(period_s)
            return
        step_s = 0.1
        for _ in range(max(round(period_s / step_s), 1)):
            for node in self.nodes.values():
                node.sampler.sample_once()
            self.clock.step(step_s)

    async def _sample_agents(self) -> None:
        """The agents' samples over one meter period; a reconciliation round when one is due
        (the phases watched, the scatterer, the leases renewed)."""
        step_s = 1.0 / self.sample_hz
        for _ in range(max(round(self.settings.meter_period_s / step_s), 1)):
            for node in self.nodes.values():
                node.sampler.sample_once()
            self.clock.step(step_s)
        if self.clock.monotonic() >= self._next_round_s:
            self._next_round_s += self.settings.reconcile_period_s
            await self.fleet.telemetry()
            await asyncio.sleep(0)
            await self.fleet.watch_phases()
            await self.scatterer.step()
            await self.targets.reconcile()

    async def run_for(self, seconds: float) -> list[tuple[float, float | None]]:
        """Ticks for `seconds`: (time [s], metered kW) at each."""
        out = []
        for _ in range(round(seconds / self.settings.meter_period_s)):
            out.append((self.clock.monotonic(), await self.tick()))
        return out

    def limits(self) -> dict[str, list[float]]:
        return {
            a: [n.backend.enforced_limit_w(g) for g in range(n.backend.count())]
            for a, n in self.nodes.items()
        }


def _backends(
    truth: Truth,
    gpus_per_node: int,
    clock: SteppedClock,
    seed: int,
    sensor: SensorModel | None,
) -> list[SimulatedBackend]:
    """A simulated node per node the truth's jobs are placed on, running the truth."""
    mix = parse_job_mix({"jobs": truth.jobs})
    names = sorted({p.node for j in mix.jobs for p in j.placement or ()})
    return [
        SimulatedBackend(
            gpus_per_node,
            mix=mix,
            node_id=n,
            clock=clock.monotonic,
            seed=seed,
            sensor=sensor,
        )
        for n in names
    ]
