"""A simulated site as real ones are: for the campaign benchmark (issue 31, item 8).

`flexgate.lab.simsite` builds agents, a meter and the gateway's services on a stepped clock with
the meter the loop believes in. `RealisticSite` keeps that site and swaps its meter for one
that behaves as facility meters do, and lets the site change under an event:

- the meter's path: pure transport delay (`dead_s`, 0-60 s: a BMS or SCADA hop), a first-order
  lag (`lag_s`, 1-60 s), each reading the mean over its last `averaging_s` (a revenue meter's
  demand register), Gaussian noise and quantisation to `quantum_kw`;
- meter faults: frozen at a value (fresh timestamps, one reading), an offset that appears
  mid-event (a CT ratio or scaling changed), and dropouts (no answer for a while);
- the site itself: jobs that end and start mid-event (the GPUs go idle or busy at once; the
  scheduler reports it to the gateway's job book `report_s` later), job power drifting up to
  +-15% from the declared (seen by the meter: the agents' telemetry does not see it), the
  overhead factor wrong by up to 30% (`draw_site`), and static load stepping as cooling cycles.

The truth (`true_facility_kw`) is what the loop is scored on; `oracle_uncapped_kw` is what the
site would draw now without any event (every job at its uncapped mean, as drifted), the
reference a delta target is measured against.

The agents' GPUs sit behind an H200's power sensor (`flexmodel.sensors`: NVML's instant field,
each reading held 100 ms, the mean of the last 100 ms: a 0.1 s lag). The agents read their
GPUs' power at 10 Hz and the gateway has each GPU's mean over the last 10 s (`read_power`):
over 10 s the jobs' swings and the sensor's 0.1 s average out, so each reading is the GPU's
mean power at its cap (`MeanReadings`; reading the waveform through the sensor made the
campaign four times slower). A job's drift is in what they read, as NVML would show it, and
no GPU drifts above the limit it enforces. The meter reads the GPUs' power as it is.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.simulated import IDLE_W, SimulatedBackend
from flexgate.lab.jobs import lab_jobs
from flexgate.lab.simsite import SimulatedSite, draw_truth
from flexmodel.sensors import SENSORS
from gateway.errors import MeterError
from gateway.settings import GatewaySettings

DECLARED_K = 1.3  #: the overhead factor the site declares
K_ERROR = 0.3  #: the true overhead factor is off by up to this share
DRIFT = 0.15  #: a job's power drifts up to this share from its declared


@dataclass
class MeterPath:
    """How the facility meter sees the truth [s, kW]."""

    dead_s: float = 0.0
    lag_s: float = 1.0
    averaging_s: float = 0.0
    noise_kw: float = 0.0
    quantum_kw: float = 0.0


@dataclass
class Cooling:
    """Static load that steps as chillers cycle: `base_kw`, plus `step_kw` for `on_s` of every
    `cycle_s` (from `phase_s`)."""

    base_kw: float
    step_kw: float = 0.0
    cycle_s: float = 1800.0
    on_s: float = 600.0
    phase_s: float = 0.0

    def kw(self, now_s: float) -> float:
        if not self.step_kw:
            return self.base_kw
        return self.base_kw + (
            self.step_kw if (now_s + self.phase_s) % self.cycle_s < self.on_s else 0.0
        )

    def next_step_s(self, now_s: float) -> float:
        """When the load next steps [s on the clock]."""
        if not self.step_kw:
            return math.inf
        t = (now_s + self.phase_s) % self.cycle_s
        return now_s + (self.on_s - t if t < self.on_s else self.cycle_s - t)

    def last_step_s(self, now_s: float) -> float:
        """When the load last stepped, at or before `now_s` [s on the clock]."""
        if not self.step_kw:
            return -math.inf
        t = (now_s + self.phase_s) % self.cycle_s
        return now_s - (t if t < self.on_s else t - self.on_s)


@dataclass
class SiteDraw:
    """One random site: what was declared, the truth, the meter and the cooling."""

    declared: list[dict[str, Any]]
    truth_jobs: list[dict[str, Any]]
    overhead_factor: float
    cooling: Cooling
    path: MeterPath
    drift: dict[str, float] = field(default_factory=dict)  #: job id: power factor now


def draw_site(rng: np.random.Generator, *, max_nodes: int = 8) -> SiteDraw:
    """A random site of at most `max_nodes` nodes of 8 GPUs, as issue 31 item 8 lists it."""
    nodes = int(rng.integers(2, max_nodes + 1))
    declared = lab_jobs(nodes, 8, int(rng.integers(1 << 30)))
    truth = draw_truth(declared, overhead_factor=DECLARED_K, static_kw=0.0, rng=rng)
    k = DECLARED_K * (1 + rng.uniform(-K_ERROR, K_ERROR))
    gpu_kw = sum(j["power_w"] * j["gpus"] for j in declared) / 1000.0
    static_kw = float(rng.uniform(0.1, 0.4)) * DECLARED_K * gpu_kw
    cycling = rng.random() < 0.6
    cooling = Cooling(
        base_kw=static_kw,
        step_kw=float(rng.uniform(0.02, 0.08)) * DECLARED_K * gpu_kw if cycling else 0.0,
        cycle_s=float(rng.uniform(1200.0, 3600.0)),
        on_s=float(rng.uniform(300.0, 900.0)),
        phase_s=float(rng.uniform(0.0, 3600.0)),
    )
    path = MeterPath(
        dead_s=float(rng.uniform(0.0, 60.0)),
        lag_s=float(np.exp(rng.uniform(math.log(1.0), math.log(60.0)))),
        averaging_s=float(rng.choice([0.0, 0.0, 5.0, 15.0, 30.0, 60.0])),
        noise_kw=float(rng.uniform(0.0, 0.005)) * DECLARED_K * gpu_kw,
        quantum_kw=float(rng.choice([0.0, 0.01, 0.1, 0.5])),
    )
    return SiteDraw(declared, truth.jobs, max(round(k, 3), 1.0), cooling, path)


class RealisticMeter:
    """The facility meter: the truth through dead time, lag and averaging, with noise and
    quantisation; `fault` is None, "stop" (a dropout), "freeze" or "offset"."""

    source = "sim://realistic-facility"

    def __init__(self, site: RealisticSite, path: MeterPath, seed: int) -> None:
        self.site, self.path = site, path
        self.rng = np.random.default_rng(seed)
        self.fault: str | None = None
        self.offset_kw = 0.0  #: added to every reading while `fault` is "offset"
        self._frozen_kw = 0.0
        now_s = site.clock.monotonic()
        self._lagged_kw = site.true_facility_kw()
        self._at_s = now_s
        #: (time, lagged kW): enough to look back over the dead time and the averaging
        self._history: deque[tuple[float, float]] = deque([(now_s, self._lagged_kw)])

    def true_facility_kw(self) -> float:
        return self.site.true_facility_kw()

    def freeze(self, offset_kw: float = 0.0) -> None:
        """From now on read what the meter reads now, plus `offset_kw`, unchanged."""
        self._frozen_kw = self._clean_kw(self.site.clock.monotonic()) + offset_kw
        self.fault = "freeze"

    def _advance(self, now_s: float) -> None:
        dt_s, self._at_s = now_s - self._at_s, now_s
        blend = 1.0 - math.exp(-dt_s / self.path.lag_s) if self.path.lag_s else 1.0
        self._lagged_kw += blend * (self.site.true_facility_kw() - self._lagged_kw)
        self._history.append((now_s, self._lagged_kw))
        keep_s = now_s - self.path.dead_s - self.path.averaging_s - 1.0
        while len(self._history) > 2 and self._history[1][0] <= keep_s:
            self._history.popleft()

    def _clean_kw(self, now_s: float) -> float:
        """The lagged truth `dead_s` ago, averaged over `averaging_s` (held between samples:
        a clock that strode through a steady hold held the value it had)."""
        end_s = now_s - self.path.dead_s
        start_s = end_s - self.path.averaging_s
        held = self._history[0][1]
        inside = []
        for at_s, kw in self._history:
            if at_s <= start_s:
                held = kw
            elif at_s <= end_s:
                inside.append(kw)
        return (
            float(np.mean([held, *inside]))
            if inside and self.path.averaging_s
            else (inside[-1] if inside else held)
        )

    async def read_kw(self) -> float:
        now_s = self.site.clock.monotonic()
        self._advance(now_s)
        if self.fault == "stop":
            raise MeterError("the simulated meter does not answer (a dropout)")
        if self.fault == "freeze":
            reading = self._frozen_kw  # a register holding its last value, in its own steps
        else:
            reading = self._clean_kw(now_s)
            if self.path.noise_kw:
                reading += float(self.rng.normal(0.0, self.path.noise_kw))
            if self.fault == "offset":
                reading += self.offset_kw
        if self.path.quantum_kw:
            reading = round(reading / self.path.quantum_kw) * self.path.quantum_kw
        return reading

    async def aclose(self) -> None:
        return None


def drifted_w(backend: SimulatedBackend, index: int, drift: dict[str, float]) -> float:
    """A GPU's mean power at its cap with its job's drift (a share of its power), never above
    the limit it enforces [W]."""
    job = backend.gpus[index].job
    mean_w = backend.mean_power_w(index)
    factor = 1.0 if job is None else drift.get(job.id, 1.0)
    if factor <= 1.0:
        return mean_w * factor
    return min(mean_w * factor, max(backend.enforced_limit_w(index), mean_w))


class MeanReadings:
    """A node's GPUs as its agent's power readings average them: each GPU's mean power at its
    cap (drifted), and its limit."""

    def __init__(self, backend: SimulatedBackend, drift: dict[str, float]) -> None:
        self.backend, self.drift = backend, drift

    def power_w(self, index: int) -> float:
        return drifted_w(self.backend, index, self.drift)

    def enforced_limit_w(self, index: int) -> float:
        return self.backend.enforced_limit_w(index)


class RealisticSite:
    """`flexgate.lab.simsite.SimulatedSite` with the realistic meter and a site that changes.

    Only the simulated site's constructor and its `clock`, `backends`, `book`, `feed`,
    `tracker`, `power` and `run_for` are used, so the same site runs against an older loop
    (the campaign benchmark runs the loop of d96b321 beside today's).
    """

    def __init__(
        self,
        draw: SiteDraw,
        *,
        seed: int,
        meter_period_s: float = 1.0,
        folder: Path | None = None,
        **settings: Any,
    ) -> None:
        from flexgate.lab.simsite import Truth

        self.draw = draw
        known = GatewaySettings.model_fields
        path = draw.path
        # The loop is told the meter's path as a calibration would identify it.
        told: dict[str, Any] = {
            "meter_averaging_s": path.averaging_s,
            "meter_noise_kw": max(path.noise_kw, path.quantum_kw / math.sqrt(12.0), 0.01),
        }
        settings = {k: v for k, v in {**told, **settings}.items() if k in known}
        self.sim = SimulatedSite(
            draw.declared,
            Truth(draw.truth_jobs, draw.overhead_factor, draw.cooling.base_kw),
            declared_overhead_factor=DECLARED_K,
            meter_period_s=meter_period_s,
            time_constant_s=path.lag_s,
            meter_delay_s=path.dead_s,
            seed=seed,
            folder=folder,
            sensor=SENSORS["H200"],
            read_power=True,
            **settings,
        )
        self.clock, self.book, self.tracker = self.sim.clock, self.sim.book, self.sim.tracker
        self.backends: list[SimulatedBackend] = self.sim.backends
        self.ended: dict[str, list[tuple[SimulatedBackend, int, Any]]] = {}
        self.meter = RealisticMeter(self, path, seed)
        for node in self.sim.nodes.values():
            node.sampler.backend = MeanReadings(node.backend, draw.drift)  # type: ignore[assignment]
        self.sim.meter = self.meter  # type: ignore[assignment]
        self.sim.feed.meter = self.meter
        self._uncapped_w = {  # every GPU's uncapped mean before any event
            (b.node_id, i): b.mean_power_w(i) for b in self.backends for i in range(b.count())
        }
        self._floor_w = {}  # and at its lowest cap (set for a moment, before anything runs)
        for b in self.backends:
            for i in range(b.count()):
                b.set_limit_w(i, b.constraints(i).min_w)
                self._floor_w[(b.node_id, i)] = b.mean_power_w(i)
                b.set_limit_w(i, b.constraints(i).max_w)

    async def start(self) -> None:
        await self.sim.start()

    def close(self) -> None:
        self.sim.close()

    async def run_for(self, seconds: float) -> list[tuple[float, float | None]]:
        return await self.sim.run_for(seconds)

    def _gpu_jobs(self) -> list[tuple[SimulatedBackend, int, str | None]]:
        return [
            (b, i, None if (job := b.gpus[i].job) is None else job.id)
            for b in self.backends
            for i in range(b.count())
        ]

    def _gpu_kw(self, uncapped: bool, floor: bool = False) -> float:
        total_w = 0.0
        for b, i, job in self._gpu_jobs():
            if job is None:
                total_w += IDLE_W
                continue
            if not (floor or uncapped):
                total_w += drifted_w(b, i, self.draw.drift)
                continue
            w = self._floor_w[(b.node_id, i)] if floor else self._uncapped_w[(b.node_id, i)]
            factor = self.draw.drift.get(job, 1.0)
            total_w += w * (min(factor, 1.0) if floor else factor)  # at the floor: its limit
        return total_w / 1000.0

    def true_facility_kw(self) -> float:
        """The facility's power now, before the meter's path [kW]."""
        now_s = self.clock.monotonic()
        return self.draw.cooling.kw(now_s) + self.draw.overhead_factor * self._gpu_kw(False)

    def oracle_uncapped_kw(self) -> float:
        """What the facility would draw now without any event [kW]."""
        now_s = self.clock.monotonic()
        return self.draw.cooling.kw(now_s) + self.draw.overhead_factor * self._gpu_kw(True)

    def oracle_floor_kw(self) -> float:
        """What the facility would draw now with every GPU at its lowest cap [kW]."""
        now_s = self.clock.monotonic()
        return self.draw.cooling.kw(now_s) + self.draw.overhead_factor * self._gpu_kw(False, True)

    # --- the site changing under an event -----------------------------------------------

    def end_job(self, job_id: str) -> None:
        """The job ends: its GPUs idle at once (the truth); the book hears of it later."""
        gone = []
        for b in self.backends:
            for gpu in b.gpus:
                if gpu.job is not None and gpu.job.id == job_id:
                    gone.append((b, b.gpus.index(gpu), gpu.job))
                    gpu.job = None
        self.ended[job_id] = gone

    def start_job(self, job_id: str) -> None:
        """An ended job starts again on its GPUs, under whatever caps they hold."""
        for _b, index, job in self.ended.pop(job_id, []):
            _b.gpus[index].job = job
            job.stale = True

    async def report_jobs(self) -> None:
        """The scheduler's report reaches the job book: every job that runs now."""
        running = {job for _, _, job in self._gpu_jobs() if job is not None}
        await self.book.replace([j for j in self.draw.declared if j["id"] in running], "scheduler")
