"""Simulated H200-class GPUs running the jobs a job mix places on this node.

Each GPU runs its job's two-level power waveform: a compute level and a communication level
(`flexmodel.curves.waveform_levels`), duty `duty`, period `period_s`. A cap slows the compute
phase exactly as flexmodel's curve says: the iteration period becomes
`period_s * X / x(cap)` (`flexmodel.curves.operating_point`), the communication time stays,
so the compute share grows. Both levels are clipped at the cap and scaled so that the mean
power is the curve's mean at that cap: the simulated site does what the model predicts.

A cap slows a job only while it computes. The phase [cycles] is the job's progress through
its iteration, compute in `[0, duty)` and communication in `[duty, 1)` of each cycle; it
advances at the capped pace (`duty / compute time`) in the compute part and at the uncapped
pace (`1 / period_s`) in the communication part (`advance`). Over whole iterations that is the
curve's period, so the throughput a cap leaves is the model's; within one, a cap that moves
at the iteration's rhythm slows jobs by where they are in their cycle. That is how a loop over
shared power couples jobs here: from the physics, not from a flag.

A job on several GPUs of the node runs at the pace of its most constrained GPU (synchronous
training). The firmware holds a new cap within tens of milliseconds: the clip level moves to
it with a first-order lag (`firmware_s`, 30 ms). Power readings are instantaneous, with
Gaussian noise, unless a sensor model is given (`sensor`, `flexmodel.sensors`). An
enforcement model (`enforcement`, `agents.enforcement`) gives the GPUs a real board's way of
holding a limit instead: its average reaches a new limit over the controller's time constant
(which replaces `firmware_s`), and while the limit binds the instants swing above and below it
(`average_power_w` is the average held; `site_power` sums a node's GPUs over time for the
fast path's benchmark). GPUs with no job draw `IDLE_W`. The clock is passed in (monotonic
seconds), so tests can drive time. A job's phase is one across the nodes it spans
(`job_phase`), as the GPUs of one synchronous job iterate together.

Each job shows the telemetry features of its true PFI (`job_features`): the DRAM copy product
of the feature model (`flexmodel.predictor.dram_copy_product`, with its scatter `feature_noise`
drawn from the job's id, so every node agrees), split into memory copy utilisation (what NVML
reads) and DRAM activity (what DCGM reads, `read_dram_active`), constant while the job runs.

Each GPU reports its SM clock (`sm_clock_mhz`) from the DVFS physics of its job, not from
the curve a fit assumes: the compute phase runs at the clock fraction `f` at which its power
fraction `q = s + (1 - s) f^a` (the job's own static share and exponent, the fleet family's
when the job mix gives none) equals what the cap leaves of its compute level; the
communication phase, below the cap, runs at the full clock. A clock held back by the cap
carries noise (the firmware dithers about it) and comes in `CLOCK_STEP_MHZ` steps, as NVML's
do; the full clock reads as it is. The throughput a clock gives is the job's curve's (its
clock-insensitive share): the clock says nothing of it.

`irregularity` (`agents.irregularity.Irregularity`, off by default) gives the jobs real jobs'
iteration jitter, periodic pauses and slow drift of power and of pace, for testing what reads
their power; the
mean power and throughput a cap leaves are then no longer exactly the curve's.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from agents.backend import Constraints
from agents.enforcement import Enforcement
from agents.errors import BackendError, InvalidSetupError
from agents.irregularity import Irregularity
from flexmodel.curves import (
    EXPONENT,
    STATIC_SHARE,
    Curves,
    clock_fraction,
    operating_point,
    waveform_levels,
)
from flexmodel.errors import FlexModelError
from flexmodel.jobmix import parse_job_mix
from flexmodel.jobs import Job, JobMix
from flexmodel.predictor import DRAM_NOISE, dram_copy_product
from flexmodel.sensors import SensorModel

MIN_W, MAX_W, DEFAULT_W = 200.0, 700.0, 700.0
IDLE_W = 80.0
CONSTRAINTS = Constraints(min_w=MIN_W, max_w=MAX_W, default_w=DEFAULT_W)  #: every GPU's
FIRMWARE_S = 0.03
#: Curve readings kept per job (`_Job.readings`) before they are cleared
READINGS_KEPT = 64
#: The simulated GPU's highest SM clock [MHz] (an H200's boost clock), the steps its clock
#: takes and the noise of one reading (before the steps) [MHz].
MAX_CLOCK_MHZ = 1980.0
CLOCK_STEP_MHZ = 15.0
CLOCK_NOISE_MHZ = 10.0
#: An idle GPU's SM clock [MHz].
IDLE_CLOCK_MHZ = 345.0
#: The job a node runs when the mix places none on it.
DEFAULT_JOB = {
    "id": "default",
    "power_w": 650.0,
    "throughput": 20000.0,
    "period_s": 2.0,
    "duty": 0.8,
    "comm_power_fraction": 0.5,
}


def job_features(job_id: str, pfi: float, noise: float = DRAM_NOISE) -> tuple[float, float]:
    """(memory copy utilisation, DRAM activity), fractions, of a simulated job of this PFI:
    their product is the feature model's DRAM copy product, its scatter drawn from the id."""
    rng = np.random.default_rng(zlib.crc32(job_id.encode()))
    product = float(dram_copy_product(pfi, rng, noise))
    copy = min(1.0, 1.25 * math.sqrt(product))
    return copy, product / copy


def _true_pfi(job: Job) -> float:
    try:
        return job.pfi_value
    except FlexModelError:  # a sweep no cap slowed: as flexible as it gets
        return 10.0


def advance(phase: float, elapsed_s: float, duty: float, compute_s: float, comm_s: float) -> float:
    """The phase [cycles] `elapsed_s` later, at `duty / compute_s` cycles per second in the
    compute part of each cycle (`[0, duty)`) and `(1 - duty) / comm_s` in the rest."""
    if compute_s <= 0.0 or comm_s <= 0.0 or not 0.0 < duty < 1.0:
        return phase + elapsed_s / (compute_s + comm_s)
    whole = math.floor(elapsed_s / (compute_s + comm_s))
    start, left_s = math.floor(phase) + whole, elapsed_s - whole * (compute_s + comm_s)
    into = phase - math.floor(phase)  #: where in its cycle [0, 1)
    computing = into < duty
    for _ in range(3):  # less than a cycle is left: at most three parts of one
        rate = duty / compute_s if computing else (1.0 - duty) / comm_s
        part_s = ((duty if computing else 1.0) - into) / rate
        if left_s < part_s:
            break
        left_s -= part_s
        start, into = (start, duty) if computing else (start + 1, 0.0)
        computing = not computing
    rate = duty / compute_s if computing else (1.0 - duty) / comm_s
    return start + into + left_s * rate


def job_phase(job_id: str, period_s: float, now: float) -> float:
    """A job's phase [cycles] at `now`, the same on every node it spans (its GPUs iterate
    together): as if it had run uncapped since the clock's zero from an offset its id draws."""
    return (zlib.crc32(job_id.encode()) / 2**32 + now / period_s) % 1.0


@dataclass
class _Job:
    id: str
    gpus: list[int]
    curve: Curves  #: one row
    period_s: float
    duty: float
    compute_w: float
    comm_w: float
    phase0: float = 0.0  #: cycles at t0
    t0: float = 0.0
    compute_s: float = 0.0  #: the compute part of an iteration at the present caps [s]
    compute_share: float = 0.0  #: of the iteration's time
    scale: float = 1.0
    throughput: float = 0.0
    static_share: float = STATIC_SHARE  #: the job's DVFS physics (`sm_clock_mhz`)
    exponent: float = EXPONENT
    mem_copy_util: float = 0.0  #: telemetry features (`job_features`)
    dram_active: float = 0.0
    stale: bool = True  #: the caps changed since the pace was computed
    mean_w: float = 0.0  #: per GPU, over an iteration at the present caps
    #: the curve read at each cap seen (mean power, throughput, period): a job's caps take
    #: few values, and a command sets its GPUs one by one
    readings: dict[float, tuple[float, float, float]] = field(default_factory=dict, repr=False)


@dataclass
class _Gpu:
    limit_w: float = DEFAULT_W
    previous_w: float = DEFAULT_W
    changed_at: float = -math.inf
    job: _Job | None = field(default=None, repr=False)


#: Points of the true power a simulated sensor's averaging reads.
SENSOR_POINTS = 8


class SimulatedBackend:
    kind = "sim"
    averaging_s = 0.0

    def __init__(
        self,
        gpus: int = 8,
        *,
        mix: JobMix | None = None,
        node_id: str = "node-01",
        clock: Callable[[], float] = time.monotonic,
        noise_w: float = 5.0,
        seed: int = 0,
        firmware_s: float = FIRMWARE_S,
        irregularity: Irregularity | None = None,
        feature_noise: float = DRAM_NOISE,
        sensor: SensorModel | None = None,
        sensor_offset_s: float = 0.0,
        enforcement: Enforcement | None = None,
    ) -> None:
        """`sensor`: what its power readings go through (`flexmodel.sensors`: each reading
        held `update_s`, the mean of the last `average_s`), as a real GPU's do; None: the
        power as it is. `sensor_offset_s`: when its updates fall (at this offset plus whole
        `update_s`: real GPUs' sensors keep no common time). `enforcement`: how the board holds
        a limit (`agents.enforcement`); None: within `firmware_s`, never above it."""
        if gpus < 1:
            raise InvalidSetupError("a simulated node needs at least one GPU")
        #: the agent reads it (`agents.telemetry`) and corrects its phases by it
        self.sensor = sensor or SensorModel("instant", 0.0, 0.0)
        self._clock = clock
        self._noise_w = noise_w
        self.enforcement = enforcement or Enforcement(controller_s=firmware_s)
        self._firmware_s = self.enforcement.controller_s
        self._sensor_offset_s = sensor_offset_s
        self._irregular = irregularity if irregularity and not irregularity.regular else None
        self._rng = np.random.default_rng(seed)
        #: the clock's noise apart, so reading the clock leaves the power's draws as they were
        self._clock_rng = np.random.default_rng([seed, 1])
        self._lock = threading.Lock()
        self.node_id = node_id
        self._gpus = [_Gpu() for _ in range(gpus)]
        self._feature_noise = feature_noise
        self.jobs = self._place(mix, node_id, gpus)
        now = clock()
        self._started = now  #: where the pace's drift counts from
        for job in self.jobs:
            job.phase0 = job_phase(job.id, job.period_s, now)
            job.t0 = now
            self._retime(job, now)

    # --- placement -------------------------------------------------------------------------

    def _place(self, mix: JobMix | None, node_id: str, gpus: int) -> list[_Job]:
        placed: list[tuple[Job, list[int], Curves]] = []
        if mix is not None:
            for j, job in enumerate(mix.jobs):
                for where in job.placement or ():
                    if where.node == node_id:
                        bad = [g for g in where.gpus if g >= gpus]
                        if bad:
                            raise InvalidSetupError(
                                f"job '{job.id}' is placed on GPU {bad[0]} of {node_id}, which "
                                f"has {gpus} GPUs"
                            )
                        placed.append((job, list(where.gpus), mix.curves.select(slice(j, j + 1))))
        if not placed:
            default = parse_job_mix({"jobs": [DEFAULT_JOB | {"gpus": gpus}]})
            placed = [(default.jobs[0], list(range(gpus)), default.curves)]
        out = []
        for job, indices, curve in placed:
            compute, comm = waveform_levels(
                job.power_w, job.duty, job.comm_power_fraction, job.max_cap_w
            )
            sim = _Job(
                id=job.id,
                gpus=indices,
                curve=curve,
                period_s=job.period_s,
                duty=job.duty,
                compute_w=float(compute),
                comm_w=float(comm),
                static_share=STATIC_SHARE if job.static_share is None else job.static_share,
                exponent=EXPONENT if job.exponent is None else job.exponent,
            )
            sim.mem_copy_util, sim.dram_active = job_features(
                job.id, _true_pfi(job), self._feature_noise
            )
            for g in indices:
                if self._gpus[g].job is not None:
                    raise InvalidSetupError(f"GPU {g} of {node_id} is placed twice")
                self._gpus[g].job = sim
            out.append(sim)
        return out

    # --- the physics -----------------------------------------------------------------------

    def _retime(self, job: _Job, now: float) -> None:
        """Keep the job's phase continuous up to `now`; its pace is recomputed when next read.

        (A command sets every GPU of a job within microseconds: one recomputation serves them.)
        """
        job.phase0 = self._phase(job, now)  # at the pace of the caps in force since t0
        job.t0 = now
        job.stale = True

    def _pace(self, job: _Job) -> _Job:
        """The job's pace, throughput and levels for the present caps (recomputed if stale)."""
        if not job.stale:
            return job
        cap = min(self._gpus[g].limit_w for g in job.gpus)
        if cap not in job.readings:
            if len(job.readings) >= READINGS_KEPT:
                job.readings.clear()
            reading = tuple(float(v[0]) for v in operating_point(job.curve, cap))
            job.readings[cap] = cast("tuple[float, float, float]", reading)  # mean, thr, period
        mean, thr, period = job.readings[cap]
        job.mean_w = mean
        job.compute_s = period - (1.0 - job.duty) * job.period_s
        job.throughput = thr
        job.compute_share = job.compute_s / period
        levels = job.compute_share * min(cap, job.compute_w) + (1 - job.compute_share) * min(
            cap, job.comm_w
        )
        job.scale = mean / levels if levels > 0 else 1.0
        job.stale = False
        return job

    def _phase(self, job: _Job, now: float) -> float:
        comm_s = (1.0 - job.duty) * job.period_s
        elapsed = now - job.t0
        if self._irregular is not None and self._irregular.pace_drift_per_s:
            start = self._started
            job_time = self._irregular.job_time
            elapsed = job_time(now - start) - job_time(job.t0 - start)
        return advance(job.phase0, elapsed, job.duty, self._pace(job).compute_s, comm_s)

    def _power(self, index: int, now: float) -> float:
        gpu = self._gpus[index]
        job = gpu.job
        if job is None:
            return IDLE_W
        self._pace(job)
        lag = math.exp(-(now - gpu.changed_at) / self._firmware_s) if self._firmware_s else 0.0
        clip = gpu.limit_w + (gpu.previous_w - gpu.limit_w) * lag
        phase = self._phase(job, now)
        if self._irregular is None:
            cycle: float | None = phase % 1.0
            drift = 0.0
        else:
            cycle = self._irregular.position(zlib.crc32(job.id.encode()), phase)
            drift = self._irregular.drift_at(now)
        if cycle is None:  # a pause
            pause_w = self._irregular.pause_w if self._irregular else None
            level = job.comm_w if pause_w is None else pause_w
        else:
            level = job.compute_w if cycle < job.duty else job.comm_w
        held = min(min(clip, level) * job.scale + drift, clip)
        if level >= clip:  # the limit binds: the instants swing around the average it holds
            return held * self.enforcement.fluctuation(job.id, now)
        return held

    # --- GpuBackend ------------------------------------------------------------------------

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise BackendError(f"no GPU {index} on this node ({len(self._gpus)} GPUs)")
        return self._gpus[index]

    def count(self) -> int:
        return len(self._gpus)

    def identity(self, index: int) -> tuple[str, str]:
        self._gpu(index)
        return f"GPU-sim-{self.node_id}-{index:02d}", "Simulated H200"

    def constraints(self, index: int) -> Constraints:
        self._gpu(index)
        return CONSTRAINTS

    def enforced_limit_w(self, index: int) -> float:
        return self._gpu(index).limit_w

    def set_limit_w(self, index: int, watts: float) -> None:
        with self._lock:
            gpu = self._gpu(index)
            if not MIN_W <= watts <= MAX_W:
                raise BackendError(f"limit {watts:g} W is outside [{MIN_W:g}, {MAX_W:g}] W")
            if float(watts) == gpu.limit_w:
                # Nothing moves: the firmware's approach to the limit is exponential, so
                # starting it again from where it is now follows the same path.
                return
            now = self._clock()
            if gpu.job is not None:
                self._retime(gpu.job, now)
            lag = math.exp(-(now - gpu.changed_at) / self._firmware_s) if self._firmware_s else 0.0
            gpu.previous_w = gpu.limit_w + (gpu.previous_w - gpu.limit_w) * lag
            gpu.limit_w = float(watts)
            gpu.changed_at = now

    def power_w(self, index: int) -> float:
        with self._lock:
            self._gpu(index)
            value = self._reading(index, self._clock())
            return max(value + float(self._rng.normal(0.0, self._noise_w)), 0.0)

    def _reading(self, index: int, now: float) -> float:
        """What the sensor shows now: the reading made at its last update, the mean of the
        power over its averaging before then. Times before the GPU's last cap change (or its
        job's last retiming) read as at that moment: the pace before it is not kept."""
        update_s, average_s = self.sensor.update_s, self.sensor.average_s
        if update_s <= 0.0 and average_s <= 0.0:
            return self._power(index, now)
        return self._reading_made(index, self._made(now))

    def _made(self, now: float) -> float:
        """When the reading the sensor shows at `now` was made."""
        update_s, offset = self.sensor.update_s, self._sensor_offset_s
        return math.floor((now - offset) / update_s) * update_s + offset if update_s > 0 else now

    def _reading_made(self, index: int, made: float) -> float:
        """The reading made at `made`: the mean of the power over the averaging before."""
        average_s = self.sensor.average_s
        gpu = self._gpus[index]
        earliest = max(gpu.changed_at, gpu.job.t0 if gpu.job is not None else -math.inf)
        offsets = average_s * (np.arange(SENSOR_POINTS) + 0.5) / SENSOR_POINTS
        return float(np.mean([self._power(index, max(made - o, earliest)) for o in offsets]))

    def energy_j(self, index: int) -> float | None:
        return None

    def sm_clock_mhz(self, index: int) -> float | None:
        """The SM clock now [MHz], as NVML's `nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)` reads it."""
        with self._lock:
            gpu = self._gpu(index)
            true = IDLE_CLOCK_MHZ if gpu.job is None else self._clock_mhz(index, self._clock())
            if true >= MAX_CLOCK_MHZ:  # not held back: the boost clock itself
                return MAX_CLOCK_MHZ
            # Held back, the firmware dithers about the clock the cap allows.
            read = true + float(self._clock_rng.normal(0.0, CLOCK_NOISE_MHZ))
            return min(round(read / CLOCK_STEP_MHZ) * CLOCK_STEP_MHZ, MAX_CLOCK_MHZ)

    def _clock_mhz(self, index: int, now: float) -> float:
        """The clock the cap leaves the job's present phase: the compute phase's from its
        power fraction under the cap (DVFS), the communication phase's full where the cap
        does not clip it."""
        gpu = self._gpus[index]
        job = self._pace(gpu.job) if gpu.job is not None else None
        if job is None:
            return IDLE_CLOCK_MHZ
        lag = math.exp(-(now - gpu.changed_at) / self._firmware_s) if self._firmware_s else 0.0
        clip = gpu.limit_w + (gpu.previous_w - gpu.limit_w) * lag
        cycle = self._phase(job, now) % 1.0
        level = job.compute_w if cycle < job.duty else job.comm_w
        if level <= clip:
            return MAX_CLOCK_MHZ
        # The phase's power at full clock is its level; the cap leaves `clip / level` of it.
        f = clock_fraction(clip / level, job.static_share, job.exponent)
        return MAX_CLOCK_MHZ * float(f)

    def power_capped(self, index: int) -> bool | None:
        gpu = self._gpu(index)
        return gpu.job is not None and gpu.limit_w < gpu.job.compute_w

    def persistence_mode(self, index: int) -> bool | None:
        self._gpu(index)
        return True

    def memory_utilisation(self, index: int) -> float | None:
        job = self._gpu(index).job
        return 0.0 if job is None else job.mem_copy_util

    def close(self) -> None:
        return None

    # --- what DCGM would read (`agents.features.DramActivitySource`) -------------------------

    def read_dram_active(self) -> dict[int, float]:
        """Each GPU's DRAM activity [0-1], as DCGM's DCGM_FI_PROF_DRAM_ACTIVE would read it."""
        return {i: 0.0 if g.job is None else g.job.dram_active for i, g in enumerate(self._gpus)}

    # --- for the lab, the benchmarks and tests ----------------------------------------------

    def average_power_w(self, index: int, now: float | None = None) -> float:
        """The power the GPU's controller holds at `now` (default: now), without the waveform,
        the swing or the noise [W]: its job's mean over an iteration at its limit, reached
        from the mean at the limit before along the controller's approach."""
        with self._lock:
            return self._average(index, self._clock() if now is None else now)

    def _average(self, index: int, now: float) -> float:
        return float(self._averages(index, np.array([now]))[0])

    def _averages(self, index: int, times: np.ndarray) -> np.ndarray:
        gpu = self._gpu(index)
        job = gpu.job
        if job is None:
            return np.full(len(times), IDLE_W)
        held = self._pace(job).mean_w
        if gpu.changed_at == -math.inf:
            return np.full(len(times), held)
        before = self._mean_at(job, gpu.previous_w)
        return held + (before - held) * self.enforcement.remaining(times - gpu.changed_at)

    def _mean_at(self, job: _Job, cap: float) -> float:
        if cap not in job.readings:
            if len(job.readings) >= READINGS_KEPT:
                job.readings.clear()
            mean, throughput, period = (float(v[0]) for v in operating_point(job.curve, cap))
            job.readings[cap] = (mean, throughput, period)
        return job.readings[cap][0]

    def site_power(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This node's GPU power summed at each of `times` (monotonic s, ascending), without
        the noise: (as the sensors read it, as the controllers hold it on average) [W]. GPUs
        of one job at one limit draw alike (a command sets them microseconds apart): one
        stands for them. Times before a GPU's last change read as at that moment."""
        times = np.asarray(times, dtype=float)
        sensed = np.zeros(len(times))
        average = np.zeros(len(times))
        with self._lock:
            groups: dict[tuple[str, float, float], list[int]] = {}
            for i, gpu in enumerate(self._gpus):
                key = (gpu.job.id if gpu.job else "", gpu.limit_w, round(gpu.previous_w, 6))
                groups.setdefault(key, []).append(i)
            for members in groups.values():
                first, count = members[0], len(members)
                if self.sensor.update_s <= 0.0 and self.sensor.average_s <= 0.0:
                    sensed += count * np.array([self._power(first, t) for t in times])
                else:
                    made = np.array([self._made(t) for t in times])
                    unique, where = np.unique(made, return_inverse=True)
                    readings = np.array([self._reading_made(first, m) for m in unique])
                    sensed += count * readings[where]
                average += count * self._averages(first, times)
        return sensed, average

    # --- for the lab and tests -------------------------------------------------------------

    def mean_power_w(self, index: int) -> float:
        """The GPU's power averaged over its job's iteration at the present cap [W]: what a
        meter that integrates over seconds reads, without the waveform or the noise."""
        with self._lock:
            job = self._gpu(index).job
            return IDLE_W if job is None else self._pace(job).mean_w

    def job_phases(self) -> dict[str, float]:
        """Each job's phase now [cycles, unwrapped]: the truth the telemetry estimates."""
        with self._lock:
            now = self._clock()
            return {job.id: self._phase(job, now) for job in self.jobs}

    def job_throughput(self) -> dict[str, float]:
        """Each job's throughput at the present caps [tokens/s]."""
        with self._lock:
            return {job.id: self._pace(job).throughput for job in self.jobs}
