"""What simulated H200-class GPUs draw and the clocks they run at (`agents.simulated`).

Each GPU runs its job's waveform (`agents.simjobs`): both levels are clipped at the cap and
scaled so that the mean power is the curve's mean at that cap: the simulated site does what
the model predicts. A job on several GPUs of the node runs at the pace of its most constrained
GPU (synchronous training). The firmware holds a new cap within tens of milliseconds: the clip
level moves to it with a first-order lag (`firmware_s`, 30 ms). An enforcement model
(`enforcement`, `agents.enforcement`) gives the GPUs a real board's way of holding a limit
instead: its average reaches a new limit over the controller's time constant (which replaces
`firmware_s`), and while the limit binds the instants swing above and below it (`averages` is
the average held). GPUs with no job draw `IDLE_W`.

Each GPU's SM clock comes from the DVFS physics of its job, not from the curve a fit assumes
(`clock_mhz`): the compute phase runs at the clock fraction `f` at which its power fraction
`q = s + (1 - s) f^a` (the job's own static share and exponent, the fleet family's when the job
mix gives none) equals what the cap leaves of its compute level; the communication phase,
below the cap, runs at the full clock. The throughput a clock gives is the job's curve's (its
clock-insensitive share): the clock says nothing of it.

`irregularity` (`agents.irregularity.Irregularity`, off by default) gives the jobs real jobs'
iteration jitter, periodic pauses and slow drift of power and of pace, for testing what reads
their power; the mean power and throughput a cap leaves are then no longer exactly the curve's.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from agents.enforcement import Enforcement
from agents.irregularity import Irregularity
from agents.simjobs import SimJob, advance, job_phase
from flexmodel.curves import clock_fraction

MIN_W, MAX_W, DEFAULT_W = 200.0, 700.0, 700.0
IDLE_W = 80.0
FIRMWARE_S = 0.03
#: The simulated GPU's highest SM clock [MHz] (an H200's boost clock).
MAX_CLOCK_MHZ = 1980.0
#: An idle GPU's SM clock [MHz].
IDLE_CLOCK_MHZ = 345.0


@dataclass
class SimGpu:
    limit_w: float = DEFAULT_W
    previous_w: float = DEFAULT_W
    changed_at: float = -math.inf
    job: SimJob | None = field(default=None, repr=False)

    def clip_w(self, now: float, firmware_s: float) -> float:
        """The level the firmware clips at `now`: on its way from the limit before to the
        limit set, with a first-order lag of `firmware_s`."""
        lag = math.exp(-(now - self.changed_at) / firmware_s) if firmware_s else 0.0
        return self.limit_w + (self.previous_w - self.limit_w) * lag

    def known_since(self) -> float:
        """Its last cap change or its job's last retiming: the pace before it is not kept."""
        return max(self.changed_at, self.job.t0 if self.job is not None else -math.inf)


class NodePhysics:
    """A node's GPUs and the jobs on them, at any time `now` (monotonic seconds)."""

    def __init__(
        self,
        gpus: int,
        jobs: list[SimJob],
        enforcement: Enforcement,
        irregularity: Irregularity | None,
        now: float,
    ) -> None:
        self.gpus = [SimGpu() for _ in range(gpus)]
        for job in jobs:
            for g in job.gpus:
                self.gpus[g].job = job
        self.enforcement = enforcement
        self.firmware_s = enforcement.controller_s
        self.irregular = irregularity if irregularity and not irregularity.regular else None
        self.started = now  #: where the pace's drift counts from
        for job in jobs:
            job.phase0 = job_phase(job.id, job.period_s, now)
            job.t0 = now
            self.retime(job, now)

    # --- the jobs' pace --------------------------------------------------------------------

    def retime(self, job: SimJob, now: float) -> None:
        """Keep the job's phase continuous up to `now`; its pace is recomputed when next read.

        (A command sets every GPU of a job within microseconds: one recomputation serves them.)
        """
        job.phase0 = self.phase(job, now)  # at the pace of the caps in force since t0
        job.t0 = now
        job.stale = True

    def pace(self, job: SimJob) -> SimJob:
        """The job's pace, throughput and levels for the present caps (recomputed if stale)."""
        if job.stale:
            job.pace_at(min(self.gpus[g].limit_w for g in job.gpus))
        return job

    def phase(self, job: SimJob, now: float) -> float:
        elapsed = now - job.t0
        if self.irregular is not None and self.irregular.pace_drift_per_s:
            start = self.started
            job_time = self.irregular.job_time
            elapsed = job_time(now - start) - job_time(job.t0 - start)
        return advance(job.phase0, elapsed, job.duty, self.pace(job).compute_s, job.comm_s)

    # --- the GPUs --------------------------------------------------------------------------

    def set_limit(self, index: int, watts: float, now: float) -> None:
        gpu = self.gpus[index]
        if gpu.job is not None:
            self.retime(gpu.job, now)
        gpu.previous_w = gpu.clip_w(now, self.firmware_s)
        gpu.limit_w = float(watts)
        gpu.changed_at = now

    def power(self, index: int, now: float) -> float:
        """The GPU's true power at `now` [W]: its job's level at its phase, clipped."""
        gpu = self.gpus[index]
        job = gpu.job
        if job is None:
            return IDLE_W
        self.pace(job)
        clip = gpu.clip_w(now, self.firmware_s)
        phase = self.phase(job, now)
        if self.irregular is None:
            cycle: float | None = phase % 1.0
            drift = 0.0
        else:
            cycle = self.irregular.position(zlib.crc32(job.id.encode()), phase)
            drift = self.irregular.drift_at(now)
        if cycle is None:  # a pause
            pause_w = self.irregular.pause_w if self.irregular else None
            level = job.comm_w if pause_w is None else pause_w
        else:
            level = job.compute_w if cycle < job.duty else job.comm_w
        held = min(min(clip, level) * job.scale + drift, clip)
        if level >= clip:  # the limit binds: the instants swing around the average it holds
            return held * self.enforcement.fluctuation(job.id, now)
        return held

    def clock_mhz(self, index: int, now: float) -> float:
        """The clock the cap leaves the job's present phase: the compute phase's from its
        power fraction under the cap (DVFS), the communication phase's full where the cap
        does not clip it."""
        gpu = self.gpus[index]
        job = self.pace(gpu.job) if gpu.job is not None else None
        if job is None:
            return IDLE_CLOCK_MHZ
        clip = gpu.clip_w(now, self.firmware_s)
        cycle = self.phase(job, now) % 1.0
        level = job.compute_w if cycle < job.duty else job.comm_w
        if level <= clip:
            return MAX_CLOCK_MHZ
        # The phase's power at full clock is its level; the cap leaves `clip / level` of it.
        f = clock_fraction(clip / level, job.static_share, job.exponent)
        return MAX_CLOCK_MHZ * float(f)

    def mean_power_w(self, index: int) -> float:
        """The GPU's power averaged over its job's iteration at the present cap [W]."""
        job = self.gpus[index].job
        return IDLE_W if job is None else self.pace(job).mean_w

    def averages(self, index: int, times: np.ndarray) -> np.ndarray:
        """The power the GPU's controller holds at each of `times` [W]: its job's mean over
        an iteration at its limit, reached from the mean at the limit before along the
        controller's approach."""
        gpu = self.gpus[index]
        job = gpu.job
        if job is None:
            return np.full(len(times), IDLE_W)
        held = self.pace(job).mean_w
        if gpu.changed_at == -math.inf:
            return np.full(len(times), held)
        before = job.reading(gpu.previous_w)[0]
        return held + (before - held) * self.enforcement.remaining(times - gpu.changed_at)

    def alike(self) -> list[list[int]]:
        """The GPUs in groups that draw alike: one job at one limit, reached from one limit
        (a command sets them microseconds apart)."""
        groups: dict[tuple[str, float, float], list[int]] = {}
        for i, gpu in enumerate(self.gpus):
            key = (gpu.job.id if gpu.job else "", gpu.limit_w, round(gpu.previous_w, 6))
            groups.setdefault(key, []).append(i)
        return list(groups.values())
