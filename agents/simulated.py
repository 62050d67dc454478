"""Simulated H200-class GPUs running the jobs a job mix places on this node: a `GpuBackend`.

The jobs, their placement and their pace under a cap are `agents.simjobs`'s; what the GPUs
draw and the clocks they run at, `agents.simphysics`'s; what their power sensors show,
`agents.simsensor`'s. This module reads them as NVML would: power readings with Gaussian
noise, the enforced limit, the SM clock (`sm_clock_mhz`), the memory copy utilisation, and
the DRAM activity DCGM would read (`read_dram_active`). The clock is passed in (monotonic
seconds), so tests can drive time. For the lab, the benchmarks and tests it also tells the
truth the telemetry estimates: the average a GPU's controller holds (`average_power_w`), a
node's GPUs summed over time (`site_power`, for the fast path's benchmark), the jobs' phases
and throughput.

An SM clock held back by the cap carries noise (the firmware dithers about it) and comes in
`CLOCK_STEP_MHZ` steps, as NVML's do; the full clock reads as it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from agents.backend import Constraints
from agents.enforcement import Enforcement
from agents.errors import BackendError, InvalidSetupError
from agents.irregularity import Irregularity
from agents.simjobs import place_jobs
from agents.simphysics import (
    DEFAULT_W,
    FIRMWARE_S,
    IDLE_CLOCK_MHZ,
    MAX_CLOCK_MHZ,
    MIN_W,
    NodePhysics,
    SimGpu,
)

# The board's figures the lab and the tests read here.
from agents.simphysics import IDLE_W as IDLE_W
from agents.simphysics import MAX_W as MAX_W
from agents.simsensor import SimSensor
from flexmodel.jobs import JobMix
from flexmodel.predictor import DRAM_NOISE
from flexmodel.sensors import SensorModel

CONSTRAINTS = Constraints(min_w=MIN_W, max_w=MAX_W, default_w=DEFAULT_W)  #: every GPU's
#: The steps a held-back SM clock reading takes and its noise (before the steps) [MHz].
CLOCK_STEP_MHZ = 15.0
CLOCK_NOISE_MHZ = 10.0


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
        self._rng = np.random.default_rng(seed)
        #: the clock's noise apart, so reading the clock leaves the power's draws as they were
        self._clock_rng = np.random.default_rng([seed, 1])
        self._lock = threading.Lock()
        self.node_id = node_id
        self.jobs = place_jobs(mix, node_id, gpus, feature_noise)
        self._physics = NodePhysics(gpus, self.jobs, self.enforcement, irregularity, clock())
        self._sensor = SimSensor(self.sensor, sensor_offset_s, self._physics)

    @property
    def gpus(self) -> list[SimGpu]:
        """The simulated GPUs, each with the job it runs: labs end and start jobs under the
        agent by setting it (`flexgate.lab.realsite`)."""
        return self._physics.gpus

    # --- GpuBackend ------------------------------------------------------------------------

    def _gpu(self, index: int) -> SimGpu:
        gpus = self._physics.gpus
        if not 0 <= index < len(gpus):
            raise BackendError(f"no GPU {index} on this node ({len(gpus)} GPUs)")
        return gpus[index]

    def count(self) -> int:
        return len(self._physics.gpus)

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
            self._physics.set_limit(index, watts, self._clock())

    def power_w(self, index: int) -> float:
        with self._lock:
            self._gpu(index)
            value = self._sensor.reading(index, self._clock())
            return max(value + float(self._rng.normal(0.0, self._noise_w)), 0.0)

    def energy_j(self, index: int) -> float | None:
        return None

    def sm_clock_mhz(self, index: int) -> float | None:
        """The SM clock now [MHz], as NVML's `nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)` reads it."""
        with self._lock:
            gpu = self._gpu(index)
            true = (
                IDLE_CLOCK_MHZ if gpu.job is None else self._physics.clock_mhz(index, self._clock())
            )
            if true >= MAX_CLOCK_MHZ:  # not held back: the boost clock itself
                return MAX_CLOCK_MHZ
            # Held back, the firmware dithers about the clock the cap allows.
            read = true + float(self._clock_rng.normal(0.0, CLOCK_NOISE_MHZ))
            return min(round(read / CLOCK_STEP_MHZ) * CLOCK_STEP_MHZ, MAX_CLOCK_MHZ)

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
        gpus = self._physics.gpus
        return {i: 0.0 if g.job is None else g.job.dram_active for i, g in enumerate(gpus)}

    # --- for the lab, the benchmarks and tests ----------------------------------------------

    def average_power_w(self, index: int, now: float | None = None) -> float:
        """The power the GPU's controller holds at `now` (default: now), without the waveform,
        the swing or the noise [W]: its job's mean over an iteration at its limit, reached
        from the mean at the limit before along the controller's approach."""
        with self._lock:
            at = self._clock() if now is None else now
            self._gpu(index)
            return float(self._physics.averages(index, np.array([at]))[0])

    def site_power(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This node's GPU power summed at each of `times` (monotonic s, ascending), without
        the noise: (as the sensors read it, as the controllers hold it on average) [W]. GPUs
        of one job at one limit draw alike (a command sets them microseconds apart): one
        stands for them. Times before a GPU's last change read as at that moment."""
        times = np.asarray(times, dtype=float)
        sensed = np.zeros(len(times))
        average = np.zeros(len(times))
        with self._lock:
            for members in self._physics.alike():
                first, count = members[0], len(members)
                sensed += count * self._sensor.trace(first, times)
                average += count * self._physics.averages(first, times)
        return sensed, average

    def mean_power_w(self, index: int) -> float:
        """The GPU's power averaged over its job's iteration at the present cap [W]: what a
        meter that integrates over seconds reads, without the waveform or the noise."""
        with self._lock:
            self._gpu(index)
            return self._physics.mean_power_w(index)

    def job_phases(self) -> dict[str, float]:
        """Each job's phase now [cycles, unwrapped]: the truth the telemetry estimates."""
        with self._lock:
            now = self._clock()
            return {job.id: self._physics.phase(job, now) for job in self.jobs}

    def job_throughput(self) -> dict[str, float]:
        """Each job's throughput at the present caps [tokens/s]."""
        with self._lock:
            return {job.id: self._physics.pace(job).throughput for job in self.jobs}
